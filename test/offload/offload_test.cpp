// The offload layer (src/offload, docs/design.md §3.6) on its own: the sub-group pipeline visits
// every element once, in order, with the state that is on disk, and writes back what the update
// left; the store lists and allocates offloaded state as swap files and counts it in the nvme tier;
// the shard source delivers reads by hook, never by when they finish, and its read-add-write keeps
// the neighbours' elements while its writes are in flight.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/ops_cpu.h"
#include "model/layout.h"
#include "offload/nvme_dir.h"
#include "offload/shard_source.h"
#include "offload/swap_pipeline.h"
#include "plan/plan.h"
#include "temp_dir.h"
#include "zero/engine_settings.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {
namespace {

class Offload : public TempDirTest {
 protected:
  Offload() : TempDirTest("zt_offload") {}
  // O_DIRECT where this directory's filesystem takes it, as a run decides.
  bool direct() const { return offload::check_nvme_dir(dir_.string(), 0, "test").direct; }
  size_t swap_files() const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) n += e.path().extension() == ".swap";
    return n;
  }
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

TEST_F(Offload, PipelineUpdatesEveryElementOnceInOrder) {
  const size_t numel = 10000;  // neither a multiple of the sub-group nor of an I/O block
  for (int sets : {2, 3, 4}) {
    SCOPED_TRACE("buffer_count " + std::to_string(sets));
    offload::SwapSpec spec;
    spec.dir = dir_.string(), spec.buffer_count = sets, spec.queue_depth = 4, spec.subgroup_numel = 2048;
    offload::SwapFile m(offload::swap_file_path(spec.dir, sets, "m"), numel * 4, direct());
    offload::SwapFile v(offload::swap_file_path(spec.dir, sets, "v"), numel * 4, direct());
    std::vector<float> mv(numel), vv(numel);
    for (size_t i = 0; i < numel; ++i) mv[i] = float(i), vv[i] = -float(i);
    m.write_all(mv.data());
    v.write_all(vv.data());
    std::unique_ptr<float, FreeDeleter> pool(
        static_cast<float*>(std::aligned_alloc(offload::kIoAlign, offload::pool_numel(spec, numel, 2) * 4)));
    offload::SwapPipeline pipe({&m, &v}, numel, pool.get(), spec);
    EXPECT_EQ(pipe.subgroups(), 5u);
    EXPECT_EQ(offload::pool_numel(spec, numel, 2), size_t(sets) * 2 * 2048);
    for (int pass = 0; pass < 2; ++pass) {
      size_t next = 0;
      bool seen_right = true;
      pipe.for_each_subgroup([&](size_t begin, size_t n, float* const* b) {
        EXPECT_EQ(begin, next);
        next = begin + n;
        for (size_t j = 0; j < n; ++j) {
          const float i = float(begin + j);
          seen_right &= b[0][j] == i * float(1 << pass) && b[1][j] == -i + float(pass);
          b[0][j] *= 2;
          b[1][j] += 1;
        }
      });
      EXPECT_EQ(next, numel);
      EXPECT_TRUE(seen_right) << "pass " << pass << ": a sub-group did not hold what the last pass wrote";
    }
    m.read_all(mv.data());
    v.read_all(vv.data());
    for (size_t i = 0; i < numel; i += 997) {
      EXPECT_EQ(mv[i], 4.0f * float(i));
      EXPECT_EQ(vv[i], 2.0f - float(i));
    }
  }
  EXPECT_EQ(swap_files(), 0u) << "swap files outlived their SwapFile";
}

// The optimizer step inside backward (zero/optimizer.h): the walk from the end reads a sub-group
// only once the gate has opened down to it, and the gate is asked, without waiting, about the reads
// ahead. Here the "backward" writes each sub-group's gradients into the file just before opening
// the gate for it, so a read that came too early sees the stale values.
TEST_F(Offload, PipelineDescendingReadsOnlyPastTheGate) {
  const size_t numel = 10000, sub = 2048;  // 5 sub-groups, the last one short
  for (int sets : {2, 3, 4}) {
    SCOPED_TRACE("buffer_count " + std::to_string(sets));
    offload::SwapSpec spec;
    spec.dir = dir_.string(), spec.buffer_count = sets, spec.queue_depth = 4, spec.subgroup_numel = sub;
    offload::SwapFile m(offload::swap_file_path(spec.dir, sets, "m"), numel * 4, direct());
    offload::SwapFile g(offload::swap_file_path(spec.dir, sets, "g"), numel * 4, direct());
    std::vector<float> mv(numel, 1.0f), gv(numel, -1.0f);  // -1: a gradient not yet final
    m.write_all(mv.data());
    g.write_all(gv.data());
    std::unique_ptr<float, FreeDeleter> pool(
        static_cast<float*>(std::aligned_alloc(offload::kIoAlign, offload::pool_numel(spec, numel, 2) * 4)));
    offload::SwapPipeline pipe({&m, &g}, numel, pool.get(), spec, {false, true});
    size_t open_from = numel, expect = numel;
    std::vector<size_t> waited;
    bool seen_final = true;
    pipe.for_each_subgroup_descending(
        [&](size_t begin, size_t n, float* const* b) {
          EXPECT_EQ(begin + n, expect) << "not the next sub-group from the end";
          expect = begin;
          for (size_t j = 0; j < n; ++j) {
            seen_final &= b[1][j] == float(begin + j);
            b[0][j] += b[1][j];
          }
        },
        [&](size_t begin, bool wait) {
          if (!wait) return open_from <= begin;
          waited.push_back(begin);
          // Backward makes everything from `begin` up final, then opens the gate there.
          std::vector<float> fin(open_from - begin);
          for (size_t i = 0; i < fin.size(); ++i) fin[i] = float(begin + i);
          g.write_at(fin.data(), fin.size() * 4, begin * 4);
          open_from = begin;
          return true;
        });
    EXPECT_EQ(expect, 0u);
    EXPECT_TRUE(seen_final) << "a sub-group was read before the gate opened for it";
    EXPECT_EQ(waited, (std::vector<size_t>{4 * sub, 3 * sub, 2 * sub, sub, 0}));
    m.read_all(mv.data());
    g.read_all(gv.data());
    for (size_t i = 0; i < numel; i += 997) {
      EXPECT_EQ(mv[i], 1.0f + float(i));
      EXPECT_EQ(gv[i], float(i)) << "the read-only file was written back";
    }
  }
}

// A shard of fewer sub-groups than buffer sets takes only the sets it uses, and runs the same.
// Unit u's shard holds the values u*1000 + i; three units, none block-aligned.
std::vector<offload::ShardSource<float>::Range> three_units() { return {{0, 700}, {700, 1500}, {2200, 900}}; }

TEST_F(Offload, ShardSourceDeliversByHookNotByCompletion) {
  const auto units = three_units();
  std::vector<float> flat(3100);
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i = 0; i < units[u].numel; ++i) flat[units[u].flat + i] = float(u * 1000 + i);
  offload::SwapFile file(offload::swap_file_path(dir_.string(), 0, "p"), flat.size() * 4, direct());
  file.write_all(flat.data());
  const size_t buf_numel = (offload::io_round_up(1500 * 4) + offload::kIoAlign) / 4;
  std::unique_ptr<float, FreeDeleter> bufs(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, 3 * buf_numel * 4)));
  offload::ShardSource<float> src(&file, units, {bufs.get(), bufs.get() + buf_numel, bufs.get() + 2 * buf_numel}, 4);
  std::vector<std::pair<int, float>> got;  // (buffer, the shard's first value) in delivery order
  auto arrived = [&](int buf, const float* shard) { got.push_back({buf, shard[0]}); };
  auto first_of = [&](int u) { return float(u * 1000); };

  // Hook 1 queues units 2 and 1: neither is delivered in that hook, however fast the disk is.
  src.request(2, 0, arrived);
  src.request(1, 1, arrived);
  src.deliver(-1, arrived);
  EXPECT_TRUE(got.empty());
  // Hook 2 queues unit 0 and delivers the reads of hook 1, in the order they were queued, not 0.
  src.request(0, 2, arrived);
  src.deliver(-1, arrived);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], std::make_pair(0, first_of(2)));
  EXPECT_EQ(got[1], std::make_pair(1, first_of(1)));
  // Hook 3 queues unit 1 again and needs it now: everything through its buffer, in order.
  src.request(1, 0, arrived);
  src.deliver(0, arrived);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[2], std::make_pair(2, first_of(0)));
  EXPECT_EQ(got[3], std::make_pair(0, first_of(1)));
  // Between passes, synchronously, and the whole shard is there.
  const float* s2 = src.now(2, 1);
  for (size_t i = 0; i < units[2].numel; ++i) ASSERT_EQ(s2[i], float(2000 + i)) << i;

  // In memory a request is delivered at once, from the flat buffer.
  offload::ShardSource<float> mem(flat.data(), units);
  mem.request(1, 2, arrived);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[4], std::make_pair(2, first_of(1)));
  EXPECT_EQ(mem.now(2, 0), flat.data() + 2200);
}

TEST_F(Offload, ShardSourceAccumulateKeepsNeighbours) {
  std::vector<float> flat(3100);
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = float(i);
  offload::SwapFile file(offload::swap_file_path(dir_.string(), 0, "g"), flat.size() * 4, direct());
  file.write_all(flat.data());
  const size_t buf_numel = (offload::io_round_up(1500 * 4) + offload::kIoAlign) / 4;
  std::unique_ptr<float, FreeDeleter> buf(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, 2 * buf_numel * 4)));
  offload::ShardSource<float> src(&file, {}, {buf.get(), buf.get() + buf_numel}, 4);
  auto add_one = [](size_t n) { return [n](float* d) { for (size_t i = 0; i < n; ++i) d[i] += 1.0f; }; };
  src.accumulate(700, 1500, true, add_one(1500));    // fresh: 0 + 1, the old values unread
  src.accumulate(700, 1500, false, add_one(1500));   // then 1 + 1
  src.accumulate(2200, 900, false, add_one(900));    // old + 1
  src.flush();
  std::vector<float> back(flat.size());
  file.read_all(back.data());
  for (size_t i = 0; i < flat.size(); ++i) {
    const float want = i < 700 ? float(i) : i < 2200 ? 2.0f : float(i) + 1.0f;
    ASSERT_EQ(back[i], want) << i;
  }
}

// The writes accumulate() leaves in flight: neighbouring ranges share an edge block (1000 floats
// are not a whole number of blocks) and every round reads what the round before wrote, so each
// read must wait for the writes in flight on its blocks, from either buffer.
TEST_F(Offload, ShardSourceAccumulateWaitsForWritesOnItsBlocks) {
  constexpr size_t kRanges = 256, kRange = 1000, kRounds = 3;
  offload::SwapFile file(offload::swap_file_path(dir_.string(), 0, "g"), kRanges * kRange * 4, direct());
  const size_t buf_numel = (offload::io_round_up(kRange * 4) + offload::kIoAlign) / 4;
  std::unique_ptr<float, FreeDeleter> buf(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, 2 * buf_numel * 4)));
  offload::ShardSource<float> src(&file, {}, {buf.get(), buf.get() + buf_numel}, 32);
  for (size_t round = 0; round < kRounds; ++round)
    for (size_t r = kRanges; r-- > 0;)  // backward's order: the highest range first
      src.accumulate(r * kRange, kRange, round == 0, [&](float* d) {
        for (size_t i = 0; i < kRange; ++i) d[i] += float(r * kRange + i);
      });
  src.flush();
  std::vector<float> back(kRanges * kRange);
  file.read_all(back.data());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], float(kRounds) * float(i)) << i;
}

// Steps of two micro-steps each, every step starting fresh: a fresh range takes its edge blocks
// from the copies kept in memory (the neighbours' bytes as last queued), so each copy must follow
// every write, this step's and the micro-step's before; the file ends as the last step alone.
TEST_F(Offload, ShardSourceFreshRangesKeepTheNeighboursLatestBytes) {
  constexpr size_t kRanges = 64, kRange = 1000, kSteps = 3, kMicro = 2;
  offload::SwapFile file(offload::swap_file_path(dir_.string(), 0, "g"), kRanges * kRange * 4, direct());
  const size_t buf_numel = (offload::io_round_up(kRange * 4) + offload::kIoAlign) / 4;
  std::unique_ptr<float, FreeDeleter> buf(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, 2 * buf_numel * 4)));
  offload::ShardSource<float> src(&file, {}, {buf.get(), buf.get() + buf_numel}, 8);
  auto value = [](size_t step, size_t micro, size_t i) { return float(step * 100 + micro * 10) + float(i % 7); };
  for (size_t step = 0; step < kSteps; ++step) {
    for (size_t micro = 0; micro < kMicro; ++micro)
      for (size_t r = kRanges; r-- > 0;)
        src.accumulate(r * kRange, kRange, micro == 0, [&](float* d) {
          for (size_t i = 0; i < kRange; ++i) d[i] += value(step, micro, r * kRange + i);
        });
    src.flush();  // the optimizer reads the file between steps
    std::vector<float> back(kRanges * kRange);
    file.read_all(back.data());
    for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], value(step, 0, i) + value(step, 1, i)) << step << " " << i;
  }
}

TEST_F(Offload, PipelineOnAShardSmallerThanItsSets) {
  offload::SwapSpec spec;
  spec.dir = dir_.string(), spec.buffer_count = 4, spec.subgroup_numel = 2048;
  for (size_t numel : {size_t(5), size_t(3000)}) {
    const size_t groups = (numel + 2047) / 2048;
    EXPECT_EQ(offload::pool_numel(spec, numel, 1), groups * std::min<size_t>(2048, (numel * 4 + 4095) / 4096 * 1024));
    offload::SwapFile m(offload::swap_file_path(spec.dir, int(numel), "m"), numel * 4, direct());
    std::unique_ptr<float, FreeDeleter> pool(
        static_cast<float*>(std::aligned_alloc(offload::kIoAlign, offload::pool_numel(spec, numel, 1) * 4)));
    offload::SwapPipeline pipe({&m}, numel, pool.get(), spec);
    for (int pass = 0; pass < 3; ++pass)
      pipe.for_each_subgroup([&](size_t begin, size_t n, float* const* b) {
        for (size_t j = 0; j < n; ++j) b[0][j] += float(begin + j);
      });
    std::vector<float> out(numel);
    m.read_all(out.data());
    EXPECT_EQ(out[numel - 1], 3.0f * float(numel - 1));
  }
}

// A failed transfer is one error naming the file and the operation, and leaves nothing in flight.
TEST_F(Offload, UringReportsAFailedTransfer) {
  const int fd = open(path("write_only").c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> buf(8192);
  offload::Uring uring(4);
  std::string msg;
  try {
    uring.read(fd, buf.data(), buf.size(), 0, 0, "a write-only file");
    uring.wait(0);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("read of a write-only file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Bad file descriptor"), std::string::npos) << msg;
  uring.drain();  // returns: the failed piece is not counted as in flight
  uring.write(fd, buf.data(), buf.size(), 0, 1, "a write-only file");
  uring.wait(1);
  close(fd);
}

// The queue refills only inside wait() and done() (uring.h). So a transfer the queue holds whole
// moves while its caller computes, and one longer than the queue does not: 48 pieces at depth 48
// and at depth 1, with no call into the ring for a second. O_DIRECT where the directory takes it,
// so completions come from the device, not at submission from the page cache. Hence the default
// depth must hold the largest transfer of the shipped 3B plan: its largest unit's shard.
TEST_F(Offload, UringMovesWhileTheCallerComputesOnlyWhatTheQueueHolds) {
  const size_t pieces = 48, bytes = pieces * offload::Uring::kMaxIo;
  offload::SwapFile f(offload::swap_file_path(dir_.string(), 9, "param"), bytes, direct());
  std::unique_ptr<float, FreeDeleter> want(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, bytes)));
  std::unique_ptr<float, FreeDeleter> got(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, bytes)));
  for (size_t i = 0; i < bytes / 4; ++i) want.get()[i] = float(i % 100003);
  f.write_all(want.get());
  for (unsigned depth : {unsigned(pieces), 1u}) {
    std::memset(got.get(), 0, bytes);
    offload::Uring uring(depth);
    uring.read(f.fd(), got.get(), bytes, 0, 3, "param");
    std::this_thread::sleep_for(std::chrono::seconds(1));  // "compute"
    EXPECT_EQ(uring.done(3), depth >= pieces) << "depth " << depth;
    uring.wait(3);
    EXPECT_EQ(std::memcmp(got.get(), want.get(), bytes), 0) << "depth " << depth;
  }

  const Plan plan = load_plan(std::string(ZT_SOURCE_DIR) + "/plans/largest_cpu_nvme.json", {}, false);
  const EngineSettings es = engine_settings<CpuOps<float>>(plan, DataMesh::of(plan, 1, 0, 0));
  size_t largest = 0;
  for (const Unit& u : es.layout().units()) largest = std::max(largest, u.padded * sizeof(float));
  EXPECT_GE(size_t(plan.offload.queue_depth) * offload::Uring::kMaxIo, largest + offload::kIoAlign)
      << "the 3B plan's largest unit (" << largest << " bytes) would wait for its reader";
}

TEST_F(Offload, StoreKeepsOffloadedStateInSwapFiles) {
  const GPTConfig cfg = GPTConfig::make(2, 2, 34, 16, 301);
  const ParamLayout layout(cfg, zero_pad_multiple(3));
  ZeroConfig zc;
  zc.stage = 2; zc.world = 3; zc.rank = 1;
  const Partition part(layout, zc);
  offload::SwapSpec spec;
  spec.dir = (dir_ / "new" / "swap").string(), spec.rank = 1, spec.direct = direct(), spec.subgroup_numel = 1024;
  spec.optimizer = true;
  const auto list = list_model_state(layout, part, StateTypes{}, spec);
  size_t nvme = 0, pool = 0;
  for (const StateBuffer& b : list) {
    EXPECT_EQ(b.tier, b.cat == Category::optimizer ? Tier::nvme : Tier::host) << b.name();
    if (b.tier == Tier::nvme) nvme += b.bytes();
    if (b.id == StateId::swap_buffers) pool = b.bytes();
  }
  EXPECT_EQ(nvme, 2 * 4 * part.shard_total());
  // buffer_count 3 sets (fewer if the shard has fewer sub-groups) x 2 states x a sub-group (1024 elements, or
  // the shard in whole blocks if smaller).
  const size_t sub = std::min<size_t>(1024, (part.shard_total() * 4 + 4095) / 4096 * 1024);
  const size_t sets = std::min<size_t>(3, (part.shard_total() + sub - 1) / sub);
  EXPECT_EQ(pool, sets * 2 * sub * 4);
  MemoryTracker mem;
  {
    StateStore store(list, mem, spec);
    EXPECT_EQ(store.get<float>(StateId::adam_m), nullptr);
    ASSERT_NE(store.file(StateId::adam_v), nullptr);
    struct stat st {};
    ASSERT_EQ(fstat(store.file(StateId::adam_v)->fd(), &st), 0);
    EXPECT_EQ(size_t(st.st_size), offload::io_round_up(4 * part.shard_total()));
    EXPECT_EQ(st.st_nlink, 0u) << "a swap file has a name on disk";
    EXPECT_EQ(mem.current(Tier::nvme, Category::optimizer), nvme);
    EXPECT_EQ(mem.current(Tier::host, Category::staging), pool);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(store.raw(StateId::swap_buffers)) % offload::kIoAlign, 0u);
  }
  EXPECT_EQ(mem.current_total(Tier::nvme), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(spec.dir)) << "the store's swap files were not removed";
}

// Swap files have no name on disk (docs/design.md §3.6), made with O_TMPFILE or, on a filesystem
// without it (acted out by ZT_NVME_NO_TMPFILE), created and unlinked at once; either way they work.
TEST_F(Offload, SwapFilesHaveNoName) {
  for (const bool tmpfile : {true, false}) {
    SCOPED_TRACE(tmpfile ? "O_TMPFILE" : "created and unlinked");
    if (!tmpfile) setenv("ZT_NVME_NO_TMPFILE", "1", 1);
    {
      offload::SwapFile f(offload::swap_file_path(dir_.string(), 0, "m"), 5000 * 4, direct());
      struct stat st {};
      ASSERT_EQ(fstat(f.fd(), &st), 0);
      EXPECT_EQ(st.st_nlink, 0u);
      EXPECT_EQ(size_t(st.st_size), offload::io_round_up(5000 * 4));
      EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "a name is left in the directory";
      std::vector<float> want(5000, 1.5f), got(5000);
      f.write_all(want.data());
      f.read_all(got.data());
      EXPECT_EQ(got, want);
    }
    unsetenv("ZT_NVME_NO_TMPFILE");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

// Named swap files of processes that no longer run on this host are removed by the start-up check,
// in one line, and count as free space; a live process's, another host's and other files stay.
TEST_F(Offload, StartupRemovesStaleSwapFilesOfDeadProcesses) {
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  const std::string host = offload::this_host(), g = std::to_string(gone), me = std::to_string(getpid());
  const std::vector<std::string> stale = {"zerotrain.r0.p" + g + "@" + host + ".adam_m.swap",
                                          "zerotrain.r1.p" + g + ".adam_v.swap"};  // an earlier version's name
  const std::vector<std::string> kept = {"zerotrain.r0.p" + me + "@" + host + ".adam_m.swap",
                                         "zerotrain.r0.p" + g + "@elsewhere.example.adam_m.swap", "zerotrain.r0.p" + g,
                                         "notes.swap"};
  for (const auto& n : stale) std::ofstream(path(n)) << std::string(8192, 'x');
  for (const auto& n : kept) std::ofstream(path(n)) << "x";
  EXPECT_FALSE(offload::swap_file_owner("zerotrain.r0.p12.swap"));
  EXPECT_EQ(offload::swap_file_owner("zerotrain.r3.p12@a.b.c.grad.swap")->host, "a.b.c");
  EXPECT_EQ(offload::swap_file_owner(stale[1])->pid, long(gone));
  const offload::NvmeDir d = offload::check_nvme_dir(dir_.string(), 0, "test");
  EXPECT_NE(d.removed.find("offload.nvme_dir: removed 2 stale swap file(s)"), std::string::npos) << d.removed;
  for (const auto& n : stale) {
    EXPECT_NE(d.removed.find(n), std::string::npos) << d.removed;
    EXPECT_FALSE(std::filesystem::exists(path(n))) << n;
  }
  for (const auto& n : kept) EXPECT_TRUE(std::filesystem::exists(path(n))) << n;
  EXPECT_EQ(offload::check_nvme_dir(dir_.string(), 0, "test").removed, "") << "a second look finds nothing stale";
}

// offload.params (docs/design.md §3.6): initial values are written range by range at any byte
// offset (blocks partly covered keep their other bytes); a read-only file of the pipeline is read
// but never written back; Uring::done polls without blocking.
TEST_F(Offload, WriteAtKeepsNeighboursAndReadOnlyFilesAreNotWritten) {
  const size_t numel = 3000;  // 12000 bytes: three blocks, the last partly
  offload::SwapFile f(offload::swap_file_path(dir_.string(), 7, "param"), numel * 4, direct());
  std::vector<float> want(numel), got(numel);
  for (size_t i = 0; i < numel; ++i) want[i] = float(i) + 0.5f;
  // Ranges that start and end inside blocks, written out of order.
  const size_t cuts[][2] = {{1500, 2999}, {0, 7}, {7, 1500}, {2999, 3000}};
  for (const auto& c : cuts) f.write_at(want.data() + c[0], (c[1] - c[0]) * 4, c[0] * 4);
  f.read_all(got.data());
  EXPECT_EQ(got, want);

  offload::SwapFile g(offload::swap_file_path(dir_.string(), 7, "grad"), numel * 4, direct());
  g.write_all(want.data());
  offload::SwapSpec spec;
  spec.dir = dir_.string(), spec.buffer_count = 3, spec.subgroup_numel = 1024;
  std::unique_ptr<float, FreeDeleter> pool(
      static_cast<float*>(std::aligned_alloc(offload::kIoAlign, offload::pool_numel(spec, numel, 2) * 4)));
  offload::SwapPipeline pipe({&f, &g}, numel, pool.get(), spec, {false, true});
  pipe.for_each_subgroup([&](size_t, size_t n, float* const* b) {
    for (size_t j = 0; j < n; ++j) b[0][j] += b[1][j], b[1][j] = -1.0f;  // the -1 must not reach g
  });
  f.read_all(got.data());
  EXPECT_EQ(got[2999], 2.0f * want[2999]);
  g.read_all(got.data());
  EXPECT_EQ(got, want);

  offload::Uring uring(4);
  std::unique_ptr<float, FreeDeleter> blk(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, offload::kIoAlign)));
  EXPECT_TRUE(uring.done(5));  // nothing queued under the tag
  uring.read(g.fd(), blk.get(), offload::kIoAlign, offload::kIoAlign, 5, "grad");
  while (!uring.done(5)) {
  }
  EXPECT_EQ(blk.get()[0], want[1024]);
}

}  // namespace
}  // namespace zt
