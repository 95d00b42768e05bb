// ZT_CHECK_MPI(call): every MPI call goes through it. MPI_COMM_WORLD (and every communicator we
// derive from it) uses MPI_ERRORS_RETURN, so failures come back as codes and become a zt::Error
// naming file:line, the call and MPI's own error string.
// The C API only: skip the deprecated C++ bindings (they also warn under -Wextra), so linking
// the MPI C library (CMake: MPI::MPI_C) is enough.
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "runtime/error.h"

namespace zt::detail {

inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(buf, len);
}

[[noreturn]] inline void mpi_fail(const char* file, int line, const char* call, int code) {
  fail_at(file, line, std::string("MPI call failed: ") + call + ": " + mpi_error_string(code));
}

}  // namespace zt::detail

#define ZT_CHECK_MPI(call)                                                          \
  do {                                                                              \
    const int zt_mpi_rc_ = (call);                                                  \
    if (zt_mpi_rc_ != MPI_SUCCESS) ::zt::detail::mpi_fail(__FILE__, __LINE__, #call, zt_mpi_rc_); \
  } while (0)
