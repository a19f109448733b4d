// Per-channel statistics of a K or V tensor (what KIVI's paper shows first: keys have a few
// outlier channels of large magnitude, values do not), for `kvq stats`.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kvq {

/// \brief One channel of one head over the tokens: population moments, in double.
struct ChannelStats {
  double mean = 0, std = 0, amax = 0;
  double kurtosis = 0;  ///< E[(x - mean)^4] / std^4 (3 for a normal); NaN when std == 0
};

/// \brief One head: its channels, the median of their amax, and the channels whose amax exceeds
/// `threshold` x that median (in channel order; none when the median is 0).
struct HeadStats {
  int64_t head = 0;
  std::vector<ChannelStats> channels;
  double amax_median = 0;
  std::vector<int64_t> outliers;
};

/// \brief The median of v (the mean of the middle two for an even count); NaN when v is empty.
double median(std::vector<double> v);

/// \brief Statistics of x [tokens, heads, dim] per head and channel; threshold > 0.
std::vector<HeadStats> channel_stats(const Tensor3& x, double threshold);

}  // namespace kvq
