// Errors: library code throws zt::Error; train.cu catches it, prints one line, exits non-zero.
// What the user can fix (a plan field, a file, the disk, the machine) is a ZT_REQUIRE naming the
// field or file and the fix, never our source line. file:line is for our own bugs: ZT_ASSERT, and
// the ZT_CHECK_* macros around system and library calls whose failure is not the user's input.
#pragma once
#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace zt {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An allocation failed. The trainer appends the next rung of the memory ladder to the message.
struct OutOfMemory : Error {
  using Error::Error;
};

// A failure every rank knows of at the same point (a verdict the ranks agreed on: agree_or_throw,
// the plan hash check in train.cu). main prints it from the one rank whose `print` is set, and every
// rank exits 1 through MPI_Finalize: no MPI_Abort, whose banner said again, per rank, what one line said.
struct AgreedError : Error {
  AgreedError(const std::string& what, bool print) : Error(what), print(print) {}
  bool print;
};

[[noreturn]] inline void fail_at(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << what << " (" << file << ":" << line << ")";
  throw Error(os.str());
}

}  // namespace zt

// Plain condition with a message built from stream pieces: ZT_REQUIRE(n > 0, "n must be > 0, got " << n)
#define ZT_REQUIRE(cond, msg)                                   \
  do {                                                          \
    if (!(cond)) {                                              \
      std::ostringstream zt_os_;                                \
      zt_os_ << msg;                                            \
      throw ::zt::Error(zt_os_.str());                          \
    }                                                           \
  } while (0)

// Internal invariant: names file:line because it is our bug, not the user's.
#define ZT_ASSERT(cond)                                                           \
  do {                                                                            \
    if (!(cond)) ::zt::fail_at(__FILE__, __LINE__, "internal error: " #cond);     \
  } while (0)

// libc / POSIX calls that report failure through errno (not for the user's files: see above).
#define ZT_CHECK_ERRNO(cond, op_desc)                                                        \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::ostringstream zt_os_;                                                             \
      zt_os_ << op_desc << ": " << std::strerror(errno);                                     \
      ::zt::fail_at(__FILE__, __LINE__, zt_os_.str());                                       \
    }                                                                                        \
  } while (0)
