// Buffers handed to collectives. Collectives carry fp32 (the CPU backend, and the CUDA fp32 parity
// mode over NCCL). Mixed-precision (bf16) collectives come with multi-GPU training; until then a
// bf16 model runs on one rank, where stage 0 sends nothing (GradReducer::launch) and the trainer
// refuses every other combination.
#pragma once
#include <type_traits>

#include "runtime/error.h"

namespace zt {

template <class X>
float* comm_ptr(X* p) {
  if constexpr (std::is_same_v<std::remove_const_t<X>, float>) {
    return const_cast<float*>(p);
  } else {
    (void)p;
    ZT_REQUIRE(false, "ZeRO: collectives on bf16 buffers are not supported by this build yet (bf16 trains on "
                      "one rank, zero.stage 0)");
    return nullptr;
  }
}

}  // namespace zt
