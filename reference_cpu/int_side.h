// The int / KIVI cache side for attention: reads kivi::SideCache's packed codes directly.
#pragma once

#include <memory>

#include "reference_cpu/kv_cache.h"

namespace kvq {

/// \brief A SideStore over a streaming kivi::SideCache for an int<B> / kivi<B> spec.
std::unique_ptr<SideStore> make_int_side(const SchemeSpec& spec, Role role, int64_t heads,
                                         int64_t dim, const kivi::GroupQuantizers& q = {});

}  // namespace kvq
