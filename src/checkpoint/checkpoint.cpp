#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/model_file.h"
#include "checkpoint/rank_file.h"
#include "checkpoint/reader.h"
#include "model/tensor_parallel.h"
#include "runtime/memory.h"
#include "runtime/output_path.h"

namespace fs = std::filesystem;

namespace zt::ckpt {

namespace {

constexpr const char* kLatestTmp = ".latest.tmp";

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What rank r saves of a buffer, so that every element is saved exactly once. A buffer that holds
// every tensor whole is the same on every rank of the data axis (list_model_state gives whole
// tensors only to replicated buffers): data rank d of D saves elements [n d/D, n (d+1)/D) of each
// tensor. A sharded buffer is the same on the D / S shard groups of hybrid sharding
// (zero/data_mesh.h): copy c = d / S saves the c-th share of each range it holds; with one group,
// all of them. With tensor parallelism (T ranks, rank % T the tensor rank, rank / T the data rank)
// each tensor rank's slices are saved by its own data axis so; a tensor every tensor rank holds
// whole (tensor_split: replicated) is the same on all T of them, so its share is cut T ways more.
// With pipeline stages (P, stage = rank / (W / P)) all of this happens inside the stage, over its
// own tensors; the embedding unit (wte, tied to the head, and wpe) lives on the first and the last
// stage, the same on both (design §3.14), and is saved by the first.
std::vector<TensorRange> my_share(const std::vector<TensorRange>& holds, const ParamLayout& layout, const Meta& m) {
  bool whole = holds.size() == layout.tensors().size();
  for (const TensorRange& r : holds) whole = whole && r.offset == 0 && r.count == layout.tensors()[size_t(r.tensor)].numel;
  const GPTConfig& cfg = layout.config();
  const bool tied_copy = !cfg.first_stage;  // the last stage's embedding: the first stage's copy is saved
  const int64_t P = std::max<int64_t>(1, m.pipeline), per_stage = m.world / P, local = m.rank % per_stage;
  const int64_t T = std::max<int64_t>(1, m.tensor), D = per_stage / T, d = local / T, t = local % T;
  const int64_t group = m.shard_group > 0 ? m.shard_group : D;
  const size_t copies = size_t(whole ? D : D / group), copy = size_t(whole ? d : d / group);
  if (copies == 1 && T == 1 && !tied_copy) return holds;
  std::vector<TensorRange> out;
  for (const TensorRange& r : holds) {
    const ParamId id = layout.tensors()[size_t(r.tensor)].id;
    if (tied_copy && (id == ParamId::wte || id == ParamId::wpe)) continue;
    const bool everywhere = T > 1 && !split_over_tensor(id);
    const size_t cs = everywhere ? copies * size_t(T) : copies, c = everywhere ? copy * size_t(T) + size_t(t) : copy;
    const size_t n = r.count, lo = n * c / cs, hi = n * (c + 1) / cs;
    if (lo < hi) out.push_back({r.tensor, r.offset + lo, hi - lo, r.at + lo});
  }
  return out;
}

// The whole model's layout (tp 1, wte padded as for cfg.tp): the shapes and names a checkpoint
// addresses its elements by.
ParamLayout whole_layout(const GPTConfig& cfg) { return ParamLayout(cfg.whole(), 1); }

// Elements [offset, offset + n) of this rank's (local) tensor `local` in the whole tensor `whole`:
// calls f(global offset, local index, count, width) for each run of them that is consecutive there
// (width 0), or, for the input columns of a tensor-parallel rank, each block of whole local rows
// (count / width rows of `width` columns, a tensor row apart), so that a row-parallel weight is
// one 2-D dataset per piece, never a dataset per row.
template <class F>
void for_each_run(const TensorSlot& local, const GPTConfig& cfg, size_t offset, size_t n, F&& f) {
  const bool cols_split = cfg.tp > 1 && tensor_split(local.id) == TensorSplit::input_cols;
  const size_t cols = local.shape.size() == 2 ? size_t(local.shape[1]) : 1;
  for (size_t i = offset, end = offset + n; i < end;) {
    size_t run = std::min(global_run(local, cfg, i), end - i), width = 0;
    if (cols_split && i % cols == 0 && end - i >= 2 * cols) run = (end - i) / cols * cols, width = cols;
    f(global_index(local, cfg, i), i - offset, run, width);
    i += run;
  }
}

// Rank r's file, streamed one piece at a time through one host buffer: each range is cut into
// pieces of at most chunk_bytes, each its own dataset (the reader joins pieces by their offsets),
// so that no host copy is larger than a piece, however large the tensor shard. A tensor-parallel
// rank's piece becomes a dataset per run of it that is consecutive in the whole tensor (for_each_run).
uint64_t write_rank_file(const std::string& path, const Meta& meta, const ParamLayout& layout,
                         const std::vector<Buffer>& buffers, CopyFn d2h, size_t chunk_bytes,
                         const Progress& progress) {
  RankFileWriter w(path, meta);
  const GPTConfig& cfg = layout.config();
  const ParamLayout whole = whole_layout(cfg);
  std::vector<std::vector<TensorRange>> shares;
  size_t total = 0;  // bytes
  for (const Buffer& b : buffers) {
    shares.push_back(my_share(b.holds, layout, meta));
    for (const TensorRange& r : shares.back()) total += r.count * dtype_bytes(b.dtype);
  }
  const bool die = fault_kill_in_save(int(meta.rank), meta.step);
  std::vector<unsigned char> host;
  size_t done = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    const size_t eb = dtype_bytes(b.dtype), piece = std::max<size_t>(1, chunk_bytes / eb);
    for (const TensorRange& r : shares[i])
      for (size_t k = 0; k < r.count; k += piece) {
        // Tests: this rank dies here, half way through its file, as under kill -9.
        if (die && 2 * done >= total) ::raise(SIGKILL);
        const size_t n = std::min(piece, r.count - k), at = (r.at + k) * eb;
        const unsigned char* src = nullptr;
        if (b.read_range) {  // an offloaded state: from its file
          host.resize(n * eb);
          b.read_range(host.data(), host.size(), at);
          src = host.data();
        } else if (d2h && b.in_backend_memory) {  // backend memory: through the host buffer
          host.resize(n * eb);
          d2h(host.data(), static_cast<const unsigned char*>(b.base) + at, host.size());
          src = host.data();
        } else {  // host memory: written from in place
          src = static_cast<const unsigned char*>(b.base) + at;
        }
        const TensorSlot& local = layout.tensors()[size_t(r.tensor)];
        const TensorSlot& global = whole.tensors()[size_t(layout.whole_tensor_index(r.tensor))];
        ZT_ASSERT(local.name == global.name);
        for_each_run(local, cfg, r.offset + k, n, [&](size_t g, size_t from, size_t count, size_t width) {
          w.add(b.kind, b.dtype, global, g, count, src + from * eb, width);
        });
        done += n * eb;
        if (progress) progress(total ? double(done) / double(total) : 1.0);
      }
  }
  w.finish();
  return w.bytes();
}

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  ZT_REQUIRE(!ec, "checkpoint: cannot remove " << p.string() << ": " << ec.message());
}

// After a failed save: its temporary directory goes, whatever state it is in.
void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// Whether `step_dir` was saved by the run of lineage `run_id`; a directory whose rank 0 file cannot
// be read is not known to be, so it is never removed or replaced.
bool of_lineage(const fs::path& step_dir, uint64_t run_id) {
  try {
    return read_step_meta(step_dir.string()).run_id == run_id;
  } catch (const Error&) {
    return false;
  }
}

void rename_path(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  ZT_REQUIRE(!ec, "checkpoint: cannot rename " << from.string() << " to " << to.string() << ": " << ec.message());
}

// Rank 0, after every rank file is on disk: model.h5, then the rename that publishes the
// directory, then `latest` (written beside and renamed over: it always names a complete
// checkpoint), then pruning, of this run's lineage only (`run_id`: another run's steps are never
// replaced or removed). Each rename is made durable by syncing its directory.
void commit(const fs::path& root, const fs::path& tmp, const fs::path& final, int keep, uint64_t run_id) {
  write_model_file(tmp.string());
  fsync_path((tmp / kModelFile).string());
  fsync_path(tmp.string());
  std::error_code ec;
  if (fs::exists(final, ec)) {
    ZT_REQUIRE(of_lineage(final, run_id), "checkpoint.dir: " << final.string() << " was saved by another run; not "
                                                                                   "replacing it (give this run its own checkpoint.dir)");
    // The same step saved again (a run resumed from an earlier checkpoint): swap the two
    // directories in one atomic rename, so `final` is complete at every instant, then drop the old.
    ZT_REQUIRE(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) == 0,
               "checkpoint: cannot replace " << final.string() << " by " << tmp.string() << ": " << std::strerror(errno));
  } else {
    rename_path(tmp, final);
  }
  fsync_path(root.string());
  const fs::path latest_tmp = root / kLatestTmp;
  {
    std::ofstream f(latest_tmp, std::ios::trunc);
    f << final.filename().string() << "\n";
    f.close();
    ZT_REQUIRE(f, "checkpoint: cannot write " << latest_tmp.string());
  }
  fsync_path(latest_tmp.string());
  rename_path(latest_tmp, root / kLatestFile);
  fsync_path(root.string());
  remove_tree(tmp);  // the replaced checkpoint of the same step, if there was one
  // Keep `latest` and the newest keep - 1 others (by step).
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    int64_t s;
    if (e.is_directory() && is_step_dir_name(e.path().filename().string(), s) && e.path() != final &&
        of_lineage(e.path(), run_id))
      steps.push_back({s, e.path()});
  }
  ZT_REQUIRE(!ec, "checkpoint: cannot list " << root.string() << ": " << ec.message());
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = size_t(std::max(keep - 1, 0)); i < steps.size(); ++i) remove_tree(steps[i].second);
}

}  // namespace

bool fault_kill_in_save(int rank, int64_t step) {
  const char* e = std::getenv("ZT_FAULT_KILL_IN_SAVE");
  long long r = -1, s = -1;
  return e && std::sscanf(e, "%lld@%lld", &r, &s) == 2 && r == rank && s == step;
}

bool fault_pause_in_save(int rank, int64_t step) {
  const char* e = std::getenv("ZT_FAULT_PAUSE_IN_SAVE");
  long long r = -1, s = -1;
  const int n = e ? std::sscanf(e, "%lld@%lld", &r, &s) : 0;
  return n >= 1 && r == rank && (n == 1 || s == step);
}

std::string Transfer::summary(const char* verb) const {
  std::ostringstream os;
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.3f s (%.2f GB/s)", seconds, seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0);
  os << "checkpoint: " << verb << " " << dir << ": " << format_bytes(double(bytes)) << " in " << rate;
  return os.str();
}

Transfer save(Comm& comm, const std::string& dir, int keep, size_t chunk_bytes, const Meta& meta,
              const ParamLayout& layout, const std::vector<Buffer>& buffers, CopyFn d2h, const Progress& progress) {
  const auto t0 = Clock::now();
  const fs::path root(dir), name(step_dir_name(meta.step));
  const fs::path tmp = root / (".tmp_" + name.string()), final = root / name;
  std::string err;
  if (comm.rank() == 0) {
    try {
      remove_tree(tmp);  // left by a save that died
      std::error_code ec;
      fs::create_directories(tmp, ec);
      ZT_REQUIRE(!ec, "checkpoint.dir: cannot create " << tmp.string() << ": " << ec.message());
    } catch (const Error& e) {
      err = e.what();
    }
  }
  agree_or_throw(comm, err, "could not prepare the checkpoint directory");
  double bytes = 0;
  Meta mine = meta;
  mine.tensor = layout.config().tp;  // the model is the whole one (all stages), wte padded for this tensor size
  mine.model = layout.config().whole();
  try {
    bytes = double(write_rank_file((tmp / rank_file_name(comm.rank())).string(), mine, layout, buffers, d2h, chunk_bytes,
                                   progress));
  } catch (const Error& e) {
    err = e.what();
  }
  // Every rank learns whether any failed before the verdict ends them (agree_or_throw), so that
  // rank 0 removes the temporary directory whichever rank could not write.
  bool failed = !err.empty();
  for (uint64_t f : comm.all_gather_u64(failed ? 1 : 0)) failed = failed || f != 0;
  if (failed && comm.rank() == 0) remove_quietly(tmp);
  agree_or_throw(comm, err, "could not write its checkpoint file");
  if (comm.rank() == 0) {
    try {
      commit(root, tmp, final, keep, meta.run_id);
    } catch (const Error& e) {
      err = e.what();
      remove_quietly(tmp);  // unpublished, or the same step's replaced checkpoint
      remove_quietly(root / kLatestTmp);
    }
  }
  agree_or_throw(comm, err, "could not publish the checkpoint");
  if (comm.world() > 1) comm.all_reduce_sum(&bytes, 1);
  return Transfer{uint64_t(bytes), since(t0), final.string()};
}

std::string latest(const std::string& dir) {
  const fs::path root(dir), pointer = root / kLatestFile;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(pointer, ec))) return "";
  ZT_REQUIRE(!fs::is_directory(pointer, ec),
             "checkpoint: " << pointer.string() << " is a directory; it must be the file naming the newest complete "
                            << "step (as step_00000010): move it out of " << dir);
  check_input_file("checkpoint:", pointer.string());  // before the open, which a FIFO would block
  std::ifstream f(pointer);
  std::string name;
  std::getline(f, name);
  int64_t step;
  ZT_REQUIRE(f && is_step_dir_name(name, step), "checkpoint: " << pointer.string() << " does not name a step directory");
  ZT_REQUIRE(fs::is_directory(root / name, ec),
             "checkpoint: " << pointer.string() << " names " << name << ", which is not in " << dir);
  return (root / name).string();
}

std::string resolve_resume(const CheckpointSection& c) {
  if (c.resume == "none") return "";
  if (c.resume == "auto") return latest(c.dir);
  std::error_code ec;
  ZT_REQUIRE(fs::is_directory(c.resume, ec), "checkpoint.resume: " << c.resume << " is not a directory");
  if (fs::exists(fs::path(c.resume) / rank_file_name(0), ec)) return c.resume;
  const std::string l = latest(c.resume);
  ZT_REQUIRE(!l.empty(), "checkpoint.resume: " << c.resume << " is neither a checkpoint (no " << rank_file_name(0)
                                               << ") nor a checkpoint.dir with a `latest`");
  return l;
}

Transfer load(const std::string& step_dir, const Plan& plan, int world, const ParamLayout& layout,
              const std::vector<Buffer>& buffers, CopyFn h2d, ToBf16Fn to_bf16, Meta& got) {
  const auto t0 = Clock::now();
  const size_t chunk_bytes = size_t(plan.checkpoint.chunk_mb * 1048576.0);
  CheckpointReader rd(step_dir);
  got = rd.meta();
  const GPTConfig want = layout.config();  // this rank's part: its stage, its tensor rank's slices
  ZT_REQUIRE(describe_shape(got.model) == describe_shape(want.whole()),
             "checkpoint " << step_dir << " holds a model with " << describe_shape(got.model)
                           << " but the plan asks for " << describe_shape(want.whole()));
  ZT_REQUIRE(got.seed == plan.run.seed, "checkpoint " << step_dir << " was trained with run.seed " << got.seed
                                                      << " but the plan has " << plan.run.seed
                                                      << " (the data order and samples follow the seed)");
  ZT_REQUIRE(got.step <= plan.run.steps, "checkpoint " << step_dir << " is at step " << got.step
                                                       << ", past run.steps " << plan.run.steps);
  // The loader is a function of (step, global batch): continuing needs the same global batch. A
  // tensor group reads one batch, and so does a pipeline group (every stage reads the same one):
  // the data axis is world / (mesh.pipeline x mesh.tensor) ranks.
  const int T = want.tp, P = plan.mesh.pipeline, data = world / (T * P);
  const int64_t per_step = int64_t(plan.batch.micro_batch) * plan.batch.grad_accum * data;
  std::string ranks = std::to_string(world) + " ranks";
  if (P > 1) ranks += " / mesh.pipeline " + std::to_string(P);
  if (T > 1) ranks += " / mesh.tensor " + std::to_string(T);
  ZT_REQUIRE(got.next_sequence == got.step * per_step,
             "checkpoint " << step_dir << " read " << got.next_sequence << " sequences in " << got.step
                           << " steps but this plan reads " << per_step << " per step (micro_batch x grad_accum x "
                           << ranks << "); keep the global batch when resuming, e.g. change grad_accum with the "
                           << "world size");
  // Whole tensors by name: this rank's slices are read from wherever they lie (for_each_run).
  const ParamLayout whole = whole_layout(want);
  std::vector<unsigned char> host;
  for (const Buffer& b : buffers) {
    // Which saved kind fills this buffer: fp32 weights come from the master copy when the run that
    // saved kept one (mixed precision), so a CPU run can continue a GPU run's checkpoint; bf16
    // weights are rounded from fp32 ones when the checkpoint has no bf16 ones (the other way).
    Kind src = b.kind;
    if (b.kind == Kind::param && b.dtype == DType::f32 && rd.has(Kind::master)) src = Kind::master;
    if (b.kind == Kind::master && !rd.has(Kind::master)) src = Kind::param;
    ZT_REQUIRE(rd.has(src), "checkpoint " << step_dir << " has no " << kind_name(src) << " tensors");
    const bool round = b.dtype == DType::bf16 && rd.dtype(src) == DType::f32 && to_bf16;
    // The CUDA backend's bf16 shards on disk (offload.params "nvme") are filled from bf16 tensors only.
    ZT_REQUIRE(!round || !b.write_range,
               "checkpoint " << step_dir << " holds fp32 parameters; loading them into bf16 shards on disk "
                             << "(offload.params \"nvme\") is not implemented: resume once with offload.params "
                             << "\"cpu\" or \"none\", save, and continue from that checkpoint");
    ZT_ASSERT(!round || b.in_backend_memory);  // host-side state is fp32 (the moments, the master)
    ZT_REQUIRE(rd.dtype(src) == b.dtype || round,
               "checkpoint " << step_dir << " holds " << kind_name(src) << " as "
                             << (rd.dtype(src) == DType::bf16 ? "bf16" : "fp32") << " but this run keeps them as "
                             << (b.dtype == DType::bf16 ? "bf16" : "fp32"));
    const size_t eb = dtype_bytes(b.dtype), src_eb = dtype_bytes(rd.dtype(src));
    // In pieces of at most checkpoint.chunk_mb, as saved (a piece saved larger, by another plan, is
    // still read whole once to verify its checksum).
    const size_t piece = std::max<size_t>(1, chunk_bytes / std::max(eb, src_eb));
    for (const TensorRange& r : b.holds) {
      const TensorSlot& slot = layout.tensors()[size_t(r.tensor)];
      const TensorSlot& global = whole.tensors()[size_t(layout.whole_tensor_index(r.tensor))];
      ZT_ASSERT(slot.name == global.name);
      for (size_t k = 0; k < r.count; k += piece) {
        const size_t n = std::min(piece, r.count - k);
        // Elements [r.offset + k, + n) of this rank's slice of the tensor into `into`.
        auto read_into = [&](unsigned char* into) {
          for_each_run(slot, want, r.offset + k, n, [&](size_t g, size_t from, size_t count, size_t width) {
            if (width == 0) return rd.read(src, global, g, count, into + from * src_eb);
            const size_t cols = size_t(global.shape[1]);  // a block: one read per row
            for (size_t row = 0; row < count / width; ++row)
              rd.read(src, global, g + row * cols, width, into + (from + row * width) * src_eb);
          });
        };
        if (b.write_range) {  // an offloaded state: into its file
          host.resize(n * src_eb);
          read_into(host.data());
          b.write_range(host.data(), host.size(), (r.at + k) * eb);
          continue;
        }
        unsigned char* dst = static_cast<unsigned char*>(b.base) + (r.at + k) * eb;
        if ((!h2d || !b.in_backend_memory) && !round) {  // host memory: read in place
          read_into(dst);
          continue;
        }
        host.resize(n * src_eb);
        read_into(host.data());
        if (round) to_bf16(dst, reinterpret_cast<const float*>(host.data()), n);
        else h2d(dst, host.data(), host.size());
      }
    }
  }
  return Transfer{rd.bytes_read(), since(t0), step_dir};
}

}  // namespace zt::ckpt
