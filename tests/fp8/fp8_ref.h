// An independent FP8 model for tests: every value comes from the format DEFINITION
// (REFERENCE.md section 2: exponent/mantissa bits, bias, special codes), decoded in double with
// std::ldexp. Nothing here calls fp8/format.h, so the tests compare two separate derivations.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "core/spec.h"

namespace kvq::test {

/// \brief One FP8 format as REFERENCE.md section 2 defines it.
struct Fp8Def {
  Fp8Format format;
  const char* name;  ///< gtest parameter name
  int exp_bits;
  int mant_bits;
  int bias;
  double max_finite;     ///< table column "max finite"
  double min_subnormal;  ///< table column "min subnormal"
  bool fnuz;             ///< 0x80 is the only NaN, there is no -0
  bool has_inf;          ///< all-ones exponent with zero mantissa is +-inf (E5M2)
  uint8_t nan_code;      ///< the code NaN encodes to (cuda_fp8.h: 0x7F; fnuz: 0x80)
};

/// \brief Readable gtest parameter output instead of a byte dump.
inline void PrintTo(const Fp8Def& f, std::ostream* os) { *os << f.name; }

inline const std::vector<Fp8Def>& fp8_defs() {
  static const std::vector<Fp8Def> defs = {
      {Fp8Format::E4M3, "e4m3", 4, 3, 7, 448.0, std::ldexp(1.0, -9), false, false, 0x7F},
      {Fp8Format::E4M3FNUZ, "e4m3fnuz", 4, 3, 8, 240.0, std::ldexp(1.0, -10), true, false, 0x80},
      {Fp8Format::E5M2, "e5m2", 5, 2, 15, 57344.0, std::ldexp(1.0, -16), false, true, 0x7F},
  };
  return defs;
}

/// \brief What a code means by the definition.
enum class CodeKind { Finite, Inf, NaN };

inline CodeKind code_kind(const Fp8Def& f, uint8_t c) {
  const int e = (c >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = c & ((1 << f.mant_bits) - 1);
  const int e_all = (1 << f.exp_bits) - 1;
  const int m_all = (1 << f.mant_bits) - 1;
  if (f.fnuz) return c == 0x80 ? CodeKind::NaN : CodeKind::Finite;
  if (f.has_inf) return e == e_all ? (m == 0 ? CodeKind::Inf : CodeKind::NaN) : CodeKind::Finite;
  return (e == e_all && m == m_all) ? CodeKind::NaN : CodeKind::Finite;  // E4M3FN
}

/// \brief Value of a code by the definition: (-1)^s * 2^(e - bias) * (1 + m / 2^M) for e > 0,
/// (-1)^s * 2^(1 - bias) * (m / 2^M) for e == 0; +-inf / NaN per code_kind.
inline double ref_decode(const Fp8Def& f, uint8_t c) {
  const bool neg = (c & 0x80) != 0;
  const int e = (c >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = c & ((1 << f.mant_bits) - 1);
  switch (code_kind(f, c)) {
    case CodeKind::NaN:
      return std::numeric_limits<double>::quiet_NaN();
    case CodeKind::Inf:
      return neg ? -HUGE_VAL : HUGE_VAL;
    case CodeKind::Finite:
      break;
  }
  const double mag =
      e == 0 ? std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits)
             : std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), e - f.bias);
  return neg ? -mag : mag;
}

/// \brief The finite codes of one sign, ordered by magnitude (zero first: 0x00, or 0x80 for
/// negative non-fnuz formats; fnuz uses 0x00 for both signs since it has no -0).
inline std::vector<uint8_t> ordered_codes(const Fp8Def& f, bool negative) {
  std::vector<uint8_t> out;
  const unsigned sign = negative ? 0x80u : 0x00u;
  for (unsigned mag = 0; mag < 0x80; ++mag) {
    uint8_t c = static_cast<uint8_t>(sign | mag);
    if (mag == 0 && f.fnuz) c = 0x00;
    if (code_kind(f, c) == CodeKind::Finite) out.push_back(c);
  }
  return out;  // code order == magnitude order within one sign, by construction of the format
}

/// \brief Reference encoder: nearest finite value of the definition, ties to the code with an
/// even mantissa LSB; |x| >= max finite (and +-inf) saturate to +-max; NaN -> nan_code.
/// The comparisons are exact in double (x is a float, the candidates are fp8 values).
class RefEncoder {
 public:
  explicit RefEncoder(const Fp8Def& f) : f_(f) {
    for (int neg = 0; neg < 2; ++neg) {
      codes_[neg] = ordered_codes(f, neg != 0);
      for (uint8_t c : codes_[neg]) mags_[neg].push_back(std::fabs(ref_decode(f, c)));
    }
  }
  uint8_t operator()(float x) const {
    if (std::isnan(x)) return f_.nan_code;
    const int neg = std::signbit(x) ? 1 : 0;
    const std::vector<uint8_t>& codes = codes_[neg];
    const std::vector<double>& mags = mags_[neg];
    const double a = std::fabs(static_cast<double>(x));
    if (a >= f_.max_finite) return codes.back();
    const size_t hi = static_cast<size_t>(std::upper_bound(mags.begin(), mags.end(), a) -
                                          mags.begin());  // first magnitude above a
    const double lo_d = a - mags[hi - 1], hi_d = mags[hi] - a;
    if (lo_d < hi_d) return codes[hi - 1];
    if (hi_d < lo_d) return codes[hi];
    return (codes[hi - 1] & 1) == 0 ? codes[hi - 1] : codes[hi];
  }

 private:
  Fp8Def f_;
  std::vector<uint8_t> codes_[2];
  std::vector<double> mags_[2];
};

}  // namespace kvq::test
