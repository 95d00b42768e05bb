#include "zero/update_in_backward.h"

#include <omp.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "runtime/error.h"

namespace zt {

struct UpdateInBackward::Worker {
  std::mutex mu;
  std::condition_variable moved;
  size_t final_from;  // the gradient shard is final for flat elements [final_from, shard_total)
  bool abort = false;
  std::exception_ptr error;     // the worker's, read after join
  double t0_us = 0, t1_us = 0;  // the first sub-group's update, the walk's end
  std::thread thread;
  explicit Worker(size_t total) : final_from(total) {}
};

UpdateInBackward::UpdateInBackward(offload::SwapPipeline& swap, size_t shard_total,
                                   offload::SwapPipeline::Update update)
    : w_(std::make_unique<Worker>(shard_total)) {
  Worker* w = w_.get();
  const int threads = omp_get_max_threads();  // run.threads, set on this thread only
  w->thread = std::thread([&swap, w, update = std::move(update), threads] {
    omp_set_num_threads(threads);
    try {
      swap.for_each_subgroup_descending(
          [&](size_t begin, size_t n, float* const* bufs) {
            if (w->t0_us == 0) w->t0_us = Tracer::now_us();  // the trace's span: from the first update
            update(begin, n, bufs);
          },
          [w](size_t begin, bool wait) {
            std::unique_lock<std::mutex> l(w->mu);
            if (wait) w->moved.wait(l, [&] { return w->abort || w->final_from <= begin; });
            if (w->abort) throw Error("the optimizer step inside backward was abandoned");
            return w->final_from <= begin;
          });
    } catch (...) {
      w->error = std::current_exception();
    }
    w->t1_us = Tracer::now_us();
  });
}

UpdateInBackward::~UpdateInBackward() {
  if (!w_ || !w_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> l(w_->mu);
    w_->abort = true;
  }
  w_->moved.notify_all();
  w_->thread.join();
}

void UpdateInBackward::grads_final_from(size_t from) {
  {
    std::lock_guard<std::mutex> l(w_->mu);
    if (from >= w_->final_from) return;
    w_->final_from = from;
  }
  w_->moved.notify_all();
}

void UpdateInBackward::join(Tracer* tr) {
  grads_final_from(0);
  w_->thread.join();
  if (tr && w_->t0_us > 0) tr->complete("adamw (inside backward)", Tracer::kHostOptimizer, w_->t0_us, w_->t1_us - w_->t0_us);
  if (w_->error) std::rethrow_exception(w_->error);
}

}  // namespace zt
