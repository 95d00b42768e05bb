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
  void all_reduce(float* buf, size_t n) override { group_.wait(group_.all_reduce(buf, n)); }
  void all_gather(const float* send, float* recv, size_t send_n) override {
    group_.wait(group_.all_gather(send, recv, send_n));
  }
  void reduce_scatter(const float* send, float* recv, size_t recv_n) override {
    group_.wait(group_.reduce_scatter(send, recv, recv_n));
  }

 private:
  Comm& group_;
};

}  // namespace zt
