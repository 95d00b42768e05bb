// The tensor group (docs/design.md §3.13): the T adjacent ranks that split every block's matrices
// and the vocabulary (model/tensor_parallel.h). The model completes its split products through
// TensorGroupOps; here they run on a Comm that Comm::split made (train/engine_assembly.cpp), as
// blocking collectives: each result is the next op's input, so there is nothing to overlap with.
#pragma once
#include "comm/comm.h"
#include "model/tensor_parallel.h"

namespace zt {

class CommTensorGroup final : public TensorGroupOps {
 public:
  explicit CommTensorGroup(Comm& group) : group_(group) {}
  // The Comm's element: the device buffers' (NCCL: fp32 or bf16), else MPI's host floats.
  int elem_bytes() const override { return group_.device_elem_bytes() > 0 ? group_.device_elem_bytes() : 4; }
  void all_reduce(void* buf, size_t n) override { group_.wait(group_.all_reduce(elems(buf), n)); }
  void all_gather(const void* send, void* recv, size_t send_n) override {
    group_.wait(group_.all_gather(elems(send), elems(recv), send_n));
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_n) override {
    group_.wait(group_.reduce_scatter(elems(send), elems(recv), recv_n));
  }
  void all_gather_bytes(const void* send, void* recv, size_t send_bytes) override {
    const size_t e = size_t(elem_bytes());
    ZT_REQUIRE(send_bytes % e == 0, "tensor group: " << send_bytes << " bytes are not whole " << e << "-byte elements");
    all_gather(send, recv, send_bytes / e);
  }
  void broadcast_host(void* buf, size_t bytes, int root) override { group_.wait(group_.broadcast(buf, bytes, root)); }

 private:
  // Comm's collectives are declared over floats; the element they move is elem_bytes() wide.
  static float* elems(const void* p) { return static_cast<float*>(const_cast<void*>(p)); }
  Comm& group_;
};

}  // namespace zt
