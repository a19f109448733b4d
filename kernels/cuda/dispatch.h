// The one list of configurations the CUDA kernels are compiled for (STYLE 8, flashinfer's
// DISPATCH_HEAD_DIM): each list below turns a runtime value into a template argument, and a value
// outside it throws kvq::Error naming the value and the list. Tests sweep the same lists.
//
//   head_dim       64, 128          (template: register tiles are sized by it)
//   bits           2, 3, 4, 8       (template: codes per word and masks are constants)
//   fp8 format     e4m3, e4m3fnuz, e5m2
//   group size G   runtime (any G >= 1 the layout allows; attention splits align to it)
//   GQA ratio      1 .. kMaxGqa     runtime (register arrays are sized kMaxGqa)
//   batch          1 .. kMaxBatch   runtime (per-sequence views travel as kernel parameters)
//
// Plain C++ (no CUDA types), so host code and tests can include it too.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "core/spec.h"

namespace kvq::cuda {

/// \brief A compile-time list of int values: the one place a supported set is written down.
template <int... Vs>
struct IntList {
  static constexpr std::array<int, sizeof...(Vs)> values{Vs...};
  /// \brief "64, 128": for error messages.
  static std::string describe() {
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(Vs)), ...);
    return s;
  }
};

using HeadDims = IntList<64, 128>;
using BitWidths = IntList<2, 3, 4, 8>;

/// \brief Most query heads per kv head (GQA ratio) the attention kernels take.
inline constexpr int kMaxGqa = 8;
/// \brief Most sequences in one decode-attention launch.
inline constexpr int kMaxBatch = 64;

/// \brief The fp8 formats, in one list.
inline constexpr std::array<Fp8Format, 3> kFp8Formats{Fp8Format::E4M3, Fp8Format::E4M3FNUZ,
                                                      Fp8Format::E5M2};

namespace detail {
template <int V, int... Rest, typename Fn>
decltype(auto) dispatch_int(const char* fn, const char* what, const std::string& list, int64_t v,
                            Fn&& f) {
  if (v == V) return f(std::integral_constant<int, V>{});
  if constexpr (sizeof...(Rest) > 0) {
    return dispatch_int<Rest...>(fn, what, list, v, std::forward<Fn>(f));
  } else {
    throw Error(std::string(fn) + ": unsupported " + what + " " + std::to_string(v) +
                " (supported: " + list + ")");
  }
}
template <int... Vs, typename Fn>
decltype(auto) dispatch_list(IntList<Vs...>, const char* fn, const char* what, int64_t v, Fn&& f) {
  return dispatch_int<Vs...>(fn, what, IntList<Vs...>::describe(), v, std::forward<Fn>(f));
}
}  // namespace detail

/// \brief Calls f(std::integral_constant<int, D>{}) for D == head_dim, or throws naming it.
/// `fn` names the caller in the message.
template <typename Fn>
decltype(auto) dispatch_head_dim(const char* fn, int64_t head_dim, Fn&& f) {
  return detail::dispatch_list(HeadDims{}, fn, "head_dim", head_dim, std::forward<Fn>(f));
}

/// \brief Calls f(std::integral_constant<int, B>{}) for B == bits, or throws naming it.
template <typename Fn>
decltype(auto) dispatch_bits(const char* fn, int64_t bits, Fn&& f) {
  return detail::dispatch_list(BitWidths{}, fn, "bits", bits, std::forward<Fn>(f));
}

/// \brief Calls f(std::integral_constant<Fp8Format, F>{}) for F == format, or throws naming it.
template <typename Fn>
decltype(auto) dispatch_fp8_format(const char* fn, Fp8Format format, Fn&& f) {
  switch (format) {
    case Fp8Format::E4M3: return f(std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
    case Fp8Format::E4M3FNUZ: return f(std::integral_constant<Fp8Format, Fp8Format::E4M3FNUZ>{});
    case Fp8Format::E5M2: return f(std::integral_constant<Fp8Format, Fp8Format::E5M2>{});
  }
  throw Error(std::string(fn) + ": unsupported Fp8Format value " +
              std::to_string(static_cast<int>(format)) + " (supported: e4m3, e4m3fnuz, e5m2)");
}

}  // namespace kvq::cuda
