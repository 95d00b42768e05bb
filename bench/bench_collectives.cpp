// The float collectives of the MPI backend, timed the three ways comm.collectives selects, through
// zt::Comm as training calls them, at the sizes training uses (scripts/bench_collectives.sh runs it
// on shared memory and across namespace hosts on a shaped link; docs/multihost.md has the table):
//
//   ring          ring schedules of point-to-point rounds advanced by the communication thread
//                 (src/comm/ring.h, mpi_thread.h)
//   mpi           Open MPI's non-blocking collectives (libnbc) started and progressed by that thread
//   mpi_blocking  Open MPI's blocking collectives (coll/tuned: it picks ring, recursive doubling...
//                 by size; coll_tuned_*_algorithm forces one), each on a worker thread
//
// Per (op, bytes per rank, way): the median over --repeat timed runs (after one untimed) of the
// time from issue to completion on rank 0, and the bus bandwidth of the ring byte model (what each
// rank sends: all_reduce 2(N-1)/N x, reduce_scatter and all_gather (N-1)/N x the full buffer;
// comm.h). One line per measurement, then a table on rank 0.
//
//   mpirun -np 2 build/zt_bench_collectives [--sizes-kib 256,1024,4096,16384,65536] [--repeat 5]
#include "comm/mpi_check.h"  // first: <mpi.h> without the C++ bindings

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<size_t> parse_sizes(const char* s) {
  std::vector<size_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v <= 0) {
      std::fprintf(stderr, "bench_collectives: bad --sizes-kib '%s'\n", s);
      std::exit(2);
    }
    out.push_back(size_t(v) * 1024);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// What rank r holds at element i before a collective: small multiples of 1/4, so every sum is exact.
float value(int r, size_t i) { return float(r + 1) + 0.25f * float(i % 7); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = parse_sizes("256,1024,4096,16384,65536");
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sizes-kib" && i + 1 < argc) sizes = parse_sizes(argv[++i]);
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_collectives [--sizes-kib 256,1024,...] [--repeat N]\n");
      return 2;
    }
  }
  try {
    const zt::CommCollectives kinds[3] = {zt::CommCollectives::ring, zt::CommCollectives::mpi,
                                          zt::CommCollectives::mpi_blocking};
    std::unique_ptr<zt::Comm> comms[3];
    for (int w = 0; w < 3; ++w) {
      zt::CommOptions o;
      o.collectives = kinds[w];
      comms[w] = zt::make_mpi_comm(o);  // the first initialises MPI (MPI_THREAD_MULTIPLE)
    }
    const int rank = comms[0]->rank(), world = comms[0]->world();

    const char* ops[] = {"all_reduce", "reduce_scatter", "all_gather"};
    const char* ways[] = {"ring", "mpi", "mpi_blocking"};
    struct Row {
      std::string op;
      size_t bytes;
      double s[3];
    };
    std::vector<Row> rows;
    for (const char* op : ops) {
      for (size_t bytes : sizes) {
        const size_t shard = bytes / 4;        // floats per rank (reduce_scatter's result, all_gather's input)
        const size_t full = shard * size_t(world);
        // all_reduce: `bytes` is the buffer each rank holds and reduces (the model's unit or bucket);
        // reduce_scatter / all_gather: `bytes` is the shard, the full buffer world x that.
        const size_t ar_n = shard;
        std::vector<float> a(full, 1.0f), b(full, 0.0f);
        Row row{op, bytes, {0, 0, 0}};
        for (int w = 0; w < 3; ++w) {
          std::vector<double> t;
          for (int r = 0; r <= repeat; ++r) {
            for (size_t i = 0; i < full; ++i) a[i] = value(rank, i);
            ZT_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
            const auto t0 = Clock::now();
            zt::Comm& c = *comms[w];
            zt::CommHandle h;
            if (op == std::string("all_reduce")) h = c.all_reduce(a.data(), ar_n);
            else if (op == std::string("reduce_scatter")) h = c.reduce_scatter(a.data(), b.data(), shard);
            else h = c.all_gather(a.data() + size_t(rank) * shard, b.data(), shard);
            c.wait(h);
            const double s = seconds_since(t0);
            if (r > 0) t.push_back(s);
          }
          // The result is checked element by element, not only timed (every value and sum is exact).
          auto sum = [&](size_t i) {
            float s = 0;
            for (int r = 0; r < world; ++r) s += value(r, i);
            return s;
          };
          const bool ar = op == std::string("all_reduce"), rs = op == std::string("reduce_scatter");
          const size_t n_out = ar ? ar_n : rs ? shard : full;
          for (size_t i = 0; i < n_out; ++i) {
            const float got = ar ? a[i] : b[i];
            const float expect = ar ? sum(i) : rs ? sum(size_t(rank) * shard + i) : value(int(i / shard), i);
            if (got != expect) {
              std::fprintf(stderr, "bench_collectives: rank %d %s %s %zu B: element %zu is %g, expected %g\n", rank, ways[w],
                           op, bytes, i, double(got), double(expect));
              MPI_Abort(MPI_COMM_WORLD, 1);
            }
          }
          row.s[w] = median(t);
        }
        rows.push_back(row);
        if (rank == 0) {
          std::printf("%-14s %9zu KiB  ring %8.2f ms  mpi %8.2f ms  mpi_blocking %8.2f ms\n", op, bytes / 1024,
                      1e3 * row.s[0], 1e3 * row.s[1], 1e3 * row.s[2]);
          std::fflush(stdout);
        }
      }
    }
    if (rank == 0) {
      std::printf("\n%d ranks; bus GB/s = bytes each rank sends under the ring model / time\n", world);
      std::printf("%-14s %10s | %9s %9s %9s | %7s %7s %7s | %s\n", "op", "KiB/rank", "ring ms", "mpi ms", "block ms",
                  "ring", "mpi", "block", "fastest");
      for (const Row& r : rows) {
        const double factor = r.op == "all_reduce" ? 2.0 * (world - 1) / world : double(world - 1);
        const double sent = factor * double(r.bytes);
        const int best = int(std::min_element(r.s, r.s + 3) - r.s);
        std::printf("%-14s %10zu | %9.2f %9.2f %9.2f | %7.2f %7.2f %7.2f | %s (%.0f%% of ring's time)\n", r.op.c_str(),
                    r.bytes / 1024, 1e3 * r.s[0], 1e3 * r.s[1], 1e3 * r.s[2], sent / r.s[0] / 1e9, sent / r.s[1] / 1e9,
                    sent / r.s[2] / 1e9, ways[best], 100.0 * r.s[best] / r.s[0]);
      }
    }
    for (auto& c : comms) c.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
  return 0;
}
