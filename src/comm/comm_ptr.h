// Buffers handed to collectives: the seam between a caller's typed buffers and the Comm. Collectives
// carry fp32 on the wire (Comm's interface). A float buffer passes as it is. A bf16 buffer (the
// CUDA backend's mixed precision) passes as an opaque pointer that only a comm whose
// device_elem_bytes() is 2 accepts: a HostMirrorComm built for bf16 (comm/host_mirror_comm.h: reductions
// widened to fp32 in its host mirror, narrowed back once) or the NCCL comm made for bf16
// (comm/nccl_comm.h: NCCL's bf16 sum). ZeroEngine's constructor checks that a bf16 engine talks to
// such a comm, so no other Comm ever sees one.
#pragma once
#include <type_traits>

namespace zt {

template <class X>
float* comm_ptr(X* p) {
  if constexpr (std::is_same_v<std::remove_const_t<X>, float>) return const_cast<float*>(p);
  else return reinterpret_cast<float*>(const_cast<std::remove_const_t<X>*>(p));
}

}  // namespace zt
