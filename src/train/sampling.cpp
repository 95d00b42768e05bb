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
            bool root) {
  const int Tn = plan.model.seq_len, n = std::min(plan.run.sample_tokens, Tn - 1);
  std::vector<int> tokens{tokenizer.eot()};
  SampleRng rng{plan.run.seed * 0x9E3779B97F4A7C15ull + uint64_t(step) + 1};
  for (int i = 0; i < n; ++i) {
    const int t = int(tokens.size());
    engine.begin_pass(0, false);  // every rank samples the same tokens (stage 3 gathers need all)
    model.forward(tokens.data(), nullptr, 1, t);
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
  }
  if (!root) return;
  std::vector<int> body(tokens.begin() + 1, tokens.end());
  std::printf("---- sample at step %d ----\n%s\n---------------------------\n", step + 1, tokenizer.decode(body).c_str());
  std::fflush(stdout);
}

template void sample<CpuOps<float>>(GPT<CpuOps<float>>&, ZeroEngine<CpuOps<float>>&, const Tokenizer&, const Plan&, int,
                                    int, bool);
#if ZT_HAVE_CUDA
template void sample<CudaOps<float>>(GPT<CudaOps<float>>&, ZeroEngine<CudaOps<float>>&, const Tokenizer&, const Plan&,
                                     int, int, bool);
template void sample<CudaOps<bf16>>(GPT<CudaOps<bf16>>&, ZeroEngine<CudaOps<bf16>>&, const Tokenizer&, const Plan&,
                                    int, int, bool);
#endif

}  // namespace zt
