#include "train/evaluation.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/ops_cpu.h"
#include "runtime/error.h"
#include "train/pipeline_step.h"
#include "train/startup_checks.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif

namespace zt {

template <class Ops>
double evaluate(GPT<Ops>& model, ZeroEngine<Ops>& engine, DataLoader& val, Comm& comm, const Plan& plan, int V,
                int step, MetricsLog* log, Comm* pipe) {
  const int B = plan.batch.micro_batch, Tn = plan.model.seq_len;
  const int64_t n = std::min<int64_t>(plan.run.eval_batches, val.num_eval_batches());
  // Every rank of a tensor group evaluates the same batches, and every stage of a pipeline group:
  // the data axis counts them.
  const int P = plan.mesh.pipeline, batches = comm.world() / (plan.mesh.tensor * P);
  ZT_REQUIRE(n > 0, "data.val: " << plan.data.val << " holds fewer than " << B * batches << " sequences of "
                                 << Tn + 1 << " tokens");
  double sum = 0.0;
  if (pipe) {  // the last stage's losses (train/pipeline_step.h)
    sum = pipeline_eval_sum<Ops>(model, engine, *pipe, val, n, B, Tn, V);
  } else {
    std::vector<int> inputs(size_t(B) * Tn), targets(size_t(B) * Tn);
    for (int64_t i = 0; i < n; ++i) {
      val.eval_batch(i, inputs.data(), targets.data());
      check_tokens(inputs, targets, V);
      engine.begin_pass(0, false);
      sum += model.forward(inputs.data(), targets.data(), B, Tn);
    }
  }
  if (comm.world() > 1) comm.all_reduce_sum(&sum, 1);
  const double loss = sum / double(n * (comm.world() / P));
  if (log) {
    log->write({{"step", step + 1}, {"val_loss", loss}});
    std::printf("step %5d | val loss %.4f (%lld batches)\n", step + 1, loss, (long long)(n * batches));
  }
  return loss;
}

template double evaluate<CpuOps<float>>(GPT<CpuOps<float>>&, ZeroEngine<CpuOps<float>>&, DataLoader&, Comm&,
                                        const Plan&, int, int, MetricsLog*, Comm*);
#if ZT_HAVE_CUDA
template double evaluate<CudaOps<float>>(GPT<CudaOps<float>>&, ZeroEngine<CudaOps<float>>&, DataLoader&, Comm&,
                                         const Plan&, int, int, MetricsLog*, Comm*);
template double evaluate<CudaOps<bf16>>(GPT<CudaOps<bf16>>&, ZeroEngine<CudaOps<bf16>>&, DataLoader&, Comm&,
                                        const Plan&, int, int, MetricsLog*, Comm*);
#endif

}  // namespace zt
