// Size arithmetic that refuses instead of wrapping. Element and byte counts come from the plan
// (layers x batch x sequence x channels ...), and a plan can ask for sizes past 2^64: a wrapped
// count would report, or allocate, a small and wrong number. Sizes derived from the plan go
// through these; the error names the size (not a source line: the plan is at fault, not the code).
#pragma once
#include <cstddef>
#include <string>

#include "runtime/error.h"

namespace zt {

// `what` names the size for the message "<what> does not fit in 64 bits".
inline size_t checked_mul(size_t a, size_t b, const std::string& what) {
  size_t r;
  ZT_REQUIRE(!__builtin_mul_overflow(a, b, &r), what << " does not fit in 64 bits");
  return r;
}

inline size_t checked_add(size_t a, size_t b, const std::string& what) {
  size_t r;
  ZT_REQUIRE(!__builtin_add_overflow(a, b, &r), what << " does not fit in 64 bits");
  return r;
}

// x rounded up to a multiple of m (m > 0).
inline size_t checked_round_up(size_t x, size_t m, const std::string& what) {
  return checked_mul(checked_add(x, m - 1, what) / m, m, what);
}

}  // namespace zt

// liburing calls return -errno instead of setting errno; file:line and the operation, as
// ZT_CHECK_ERRNO (runtime/error.h) does for calls that set errno.
#define ZT_CHECK_URING(rc_expr, op_desc)                                                     \
  do {                                                                                       \
    const int zt_rc_ = (rc_expr);                                                            \
    if (zt_rc_ < 0) {                                                                        \
      std::ostringstream zt_os_;                                                             \
      zt_os_ << op_desc << ": " << std::strerror(-zt_rc_);                                   \
      ::zt::fail_at(__FILE__, __LINE__, zt_os_.str());                                       \
    }                                                                                        \
  } while (0)
