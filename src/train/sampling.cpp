#include "train/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "train/pipeline_step.h"

namespace zt {

namespace {

// Small deterministic RNG for sampling (xorshift64*), independent of the standard library.
struct SampleRng {
  uint64_t s;
  double uniform() {
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return double((s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
  }
};

}  // namespace

// The full forward at the current length each token (cheap at these sizes; no KV cache in the
// training model).
template <class Ops>
void sample(GPT<Ops>& model, ZeroEngine<Ops>& engine, const Tokenizer& tokenizer, const Plan& plan, int V, int step,
            bool root, Comm* pipe) {
  const int Tn = plan.model.seq_len, n = std::min(plan.run.sample_tokens, Tn - 1);
  const int stage = pipe ? pipe->rank() : 0, last = pipe ? pipe->world() - 1 : 0;
  std::vector<int> tokens{tokenizer.eot()};
  std::vector<float> boundary;
  SampleRng rng{plan.run.seed * 0x9E3779B97F4A7C15ull + uint64_t(step) + 1};
  for (int i = 0; i < n; ++i) {
    const int t = int(tokens.size());
    // (1, t, C): under sequence parallelism this rank's rows of t padded to a multiple of tp (GPT::forward)
    const GPTConfig& cfg = model.config();
    const size_t rows = cfg.sp_rows(cfg.sp ? size_t((t + cfg.tp - 1) / cfg.tp * cfg.tp) : size_t(t));
    const size_t bytes = rows * size_t(cfg.C) * sizeof(typename Ops::T);  // host memory between stages
    engine.begin_pass(0, false);  // every rank samples the same tokens (stage 3 gathers need all)
    if (pipe)  // (1, t, C) from stage to stage, chunk by chunk
      pipeline_forward(model, *pipe, tokens.data(), nullptr, 1, t, bytes, boundary);
    else
      model.forward(tokens.data(), nullptr, 1, t);
    if (stage != last) {  // the last stage draws it; the first looks it up next (the others: a place)
      int next = -1;
      if (stage == 0) pipe->wait(pipe->recv(&next, sizeof next, last));
      tokens.push_back(next);
      continue;
    }
    const std::vector<float> logits = model.logits_row(t - 1);
    double maxv = -1e30;
    for (int v = 0; v < V; ++v) maxv = std::max(maxv, double(logits[v]));
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(double(logits[v]) - maxv);
    double r = rng.uniform() * sum;
    int next = V - 1;
    for (int v = 0; v < V; ++v) {
      r -= std::exp(double(logits[v]) - maxv);
      if (r <= 0) { next = v; break; }
    }
    tokens.push_back(next);
    if (stage > 0) pipe->wait(pipe->send(&next, sizeof next, 0));
  }
  model.use_chunk(0);
  if (!root) return;
  std::vector<int> body(tokens.begin() + 1, tokens.end());
  std::printf("---- sample at step %d ----\n%s\n---------------------------\n", step + 1, tokenizer.decode(body).c_str());
  std::fflush(stdout);
}

template void sample<CpuOps<float>>(GPT<CpuOps<float>>&, ZeroEngine<CpuOps<float>>&, const Tokenizer&, const Plan&, int,
                                    int, bool, Comm*);
#if ZT_HAVE_CUDA
template void sample<CudaOps<float>>(GPT<CudaOps<float>>&, ZeroEngine<CudaOps<float>>&, const Tokenizer&, const Plan&,
                                     int, int, bool, Comm*);
template void sample<CudaOps<bf16>>(GPT<CudaOps<bf16>>&, ZeroEngine<CudaOps<bf16>>&, const Tokenizer&, const Plan&,
                                    int, int, bool, Comm*);
#endif

}  // namespace zt
