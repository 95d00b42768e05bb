// zt_bench_cpu_attention: the CPU attention kernels (kernels/attention.cpp) with both register tiles
// (attention.h: AVX2's 6 x 16, AVX-512's 8 x 32) side by side in one run, interleaved round by
// round so that both see the same machine (a shared VM's speed drifts by tens of percent from one
// minute to the next; a before/after pair of runs would measure the drift).
//
//   zt_bench_cpu_attention [--B 4] [--C 768] [--NH 12] [--T 64,256,1024] [--rounds 15]
//
// Per T, each round times forward then backward with each tile (which tile goes first alternates);
// reported: the median over rounds in ms and GFLOP/s, counting only the causal products (QK^T and PV
// over the keys each query sees: 2 * 2 * C * (t + 1) per position t, per batch row; backward's four
// products twice that). The tiles' outputs are compared bit for bit (exit 1 if they differ).
// Threads: OMP_NUM_THREADS. Last line per T: JSON for scripts.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"

namespace {

using zt::cpu::AttentionTile;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Args {
  int B = 4, C = 768, NH = 12, rounds = 15;
  std::vector<int> T = {64, 256, 1024};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "zt_bench_cpu_attention: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (k == "--B") a.B = std::atoi(v);
    else if (k == "--C") a.C = std::atoi(v);
    else if (k == "--NH") a.NH = std::atoi(v);
    else if (k == "--rounds") a.rounds = std::atoi(v);
    else if (k == "--T") {
      a.T.clear();
      for (const char* p = v; *p;) {
        a.T.push_back(std::atoi(p));
        p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p);
      }
    } else {
      std::fprintf(stderr, "usage: zt_bench_cpu_attention [--B N] [--C N] [--NH N] [--T N,N,...] [--rounds N]\n");
      std::exit(2);
    }
  }
  bool ok = a.B > 0 && a.C > 0 && a.NH > 0 && a.C % a.NH == 0 && a.rounds > 0 && !a.T.empty();
  for (int t : a.T) ok = ok && t > 0;
  if (!ok) {
    std::fprintf(stderr, "zt_bench_cpu_attention: B, C, NH, T and rounds must be positive, C a multiple of NH\n");
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const AttentionTile tiles[2] = {AttentionTile::avx2_6x16, AttentionTile::avx512_8x32};
  const char* names[2] = {"avx2_6x16", "avx512_8x32"};
  std::printf("attention, B %d C %d NH %d, %d threads, %d rounds\n", a.B, a.C, a.NH, omp_get_max_threads(), a.rounds);
  bool identical = true;
  for (const int T : a.T) {
    const size_t n_qkv = size_t(a.B) * T * 3 * a.C, n_out = size_t(a.B) * T * a.C, n_lse = size_t(a.B) * a.NH * T;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> qkv(n_qkv), dout(n_out);
    for (float& x : qkv) x = u(rng);
    for (float& x : dout) x = u(rng);
    std::vector<float> out[2], lse[2], dqkv[2];
    for (int i = 0; i < 2; i++) out[i].resize(n_out), lse[i].resize(n_lse), dqkv[i].resize(n_qkv);
    std::vector<double> fwd[2], bwd[2];
    for (int r = 0; r < a.rounds; r++) {
      for (int j = 0; j < 2; j++) {
        const int i = (r + j) % 2;  // alternate which tile runs first
        double t0 = omp_get_wtime();
        zt::cpu::attention_forward(out[i].data(), lse[i].data(), qkv.data(), a.B, T, a.C, a.NH, tiles[i]);
        const double t1 = omp_get_wtime();
        zt::cpu::attention_backward(dqkv[i].data(), dout.data(), qkv.data(), out[i].data(), lse[i].data(), a.B, T, a.C,
                                    a.NH, tiles[i]);
        const double t2 = omp_get_wtime();
        if (r > 0) fwd[i].push_back(t1 - t0), bwd[i].push_back(t2 - t1);  // round 0: warm-up
      }
    }
    const bool same = out[0] == out[1] && lse[0] == lse[1] && dqkv[0] == dqkv[1];
    identical = identical && same;
    double flops = 0;  // causal forward: QK^T and PV, 2 * C * (t + 1) each per position
    for (int t = 0; t < T; t++) flops += 4.0 * a.C * (t + 1);
    flops *= a.B;
    double ms[2][2];
    for (int i = 0; i < 2; i++) {
      ms[i][0] = 1e3 * median(fwd[i]), ms[i][1] = 1e3 * median(bwd[i]);
      std::printf("T %5d  %-12s forward %9.3f ms %6.1f GFLOP/s   backward %9.3f ms %6.1f GFLOP/s\n", T, names[i],
                  ms[i][0], flops / ms[i][0] / 1e6, ms[i][1], 2 * flops / ms[i][1] / 1e6);
    }
    const bool wide = zt::cpu::resolve_attention_tile(AttentionTile::automatic, T) == AttentionTile::avx512_8x32;
    std::printf("T %5d  8x32 / 6x16: forward %.2fx, backward %.2fx faster; outputs %s; training uses %s\n", T,
                ms[0][0] / ms[1][0], ms[0][1] / ms[1][1], same ? "bit-identical" : "DIFFER", names[wide]);
    std::printf("{\"T\": %d, \"B\": %d, \"C\": %d, \"NH\": %d, \"threads\": %d, \"fwd_ms\": [%.4f, %.4f], "
                "\"bwd_ms\": [%.4f, %.4f], \"tiles\": [\"%s\", \"%s\"], \"identical\": %s}\n",
                T, a.B, a.C, a.NH, omp_get_max_threads(), ms[0][0], ms[1][0], ms[0][1], ms[1][1], names[0], names[1],
                same ? "true" : "false");
  }
  return identical ? 0 : 1;
}
