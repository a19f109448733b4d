// Skips a test that needs backend cuda, with cuda_unavailable()'s one line (no device, or a build
// without CUDA): tests/cuda/'s plain C++ tests over kernels/backend.h and the model.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/backend.h"

#define KVQ_SKIP_WITHOUT_CUDA()                         \
  do {                                                  \
    const std::string why_ = ::kvq::cuda_unavailable(); \
    if (!why_.empty()) GTEST_SKIP() << why_;            \
  } while (0)
