// llm.c weight files (.bin, fp32 version 3): reading one tensor at a time, writing one unit at a
// time, so a sharded engine never needs the whole model in one process (docs/design.md §3.7).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <unistd.h>

#include "model/gpt.h"
#include "model/llmc_writer.h"
#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"
#include "runtime/output_path.h"

namespace zt {

namespace {
constexpr int kModelMagic = 20240326;  // llm.c model checkpoint
constexpr int kModelVersionFp32 = 3;
constexpr int kModelVersionBf16 = 5;

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;
}  // namespace

template <class Ops>
void GPT<Ops>::load_llmc(const std::string& path) {
  read_llmc(path, [&](int k, const M* values) {
    const TensorSlot& s = layout_.tensors()[size_t(k)];
    for (int u = s.unit; u <= s.last_unit; ++u) {  // wte may span embedding chunks
      const UnitPiece p = layout_.piece(u, k);
      upload(unit_param_[size_t(u)] + p.at, values + p.begin, p.count);
    }
  });
}

template <class Ops>
void GPT<Ops>::read_llmc(const std::string& path, const std::function<void(int k, const M* values)>& sink) const {
  check_input_file("model.init:", path);  // before the open, which a FIFO would block
  File f(std::fopen(path.c_str(), "rb"));
  ZT_REQUIRE(f, "model.init: cannot open " << path << ": " << std::strerror(errno));
  int header[256];
  ZT_REQUIRE(std::fread(header, sizeof(int), 256, f.get()) == 256,
             "model.init: " << path << " is too short for an llm.c checkpoint header");
  ZT_REQUIRE(header[0] == kModelMagic, "model.init: " << path << ": bad magic " << header[0]
                                                      << " (expected an llm.c model checkpoint, magic " << kModelMagic << ")");
  ZT_REQUIRE(header[1] != kModelVersionBf16, "model.init: " << path << " holds bf16 weights (llm.c version 5); "
                                                             "convert it with llm.c's scripts to fp32 (version 3)");
  ZT_REQUIRE(header[1] == kModelVersionFp32,
             "model.init: " << path << ": unsupported llm.c checkpoint version " << header[1] << " (supported: 3, fp32)");
  const int maxT = header[2], V = header[3], L = header[4], NH = header[5], C = header[6], Vp = header[7];
  ZT_REQUIRE(L == cfg_.layers() && NH == cfg_.NH && C == cfg_.C && V == cfg_.V,
             "model.init: " << path << " has n_layer " << L << ", n_head " << NH << ", n_embd " << C << ", vocab_size " << V
                            << " but the plan asks for " << cfg_.layers() << ", " << cfg_.NH << ", " << cfg_.C << ", "
                            << cfg_.V);
  ZT_REQUIRE(maxT >= cfg_.maxT, "model.init: " << path << " has " << maxT << " positions, fewer than model.seq_len "
                                               << cfg_.maxT);
  ZT_REQUIRE(Vp >= V, "model.init: " << path << ": padded vocabulary " << Vp << " < vocabulary " << V);

  std::vector<float> buf;
  std::vector<M> host;
  auto read_floats = [&](size_t n, const char* what) {
    buf.resize(n);
    ZT_REQUIRE(std::fread(buf.data(), sizeof(float), n, f.get()) == n,
               "model.init: " << path << " ends inside tensor " << what << " (truncated file?)");
  };
  // A NaN or Inf read here would surface only as a diverged loss at step 0, with advice about the
  // learning rate; the file is what is wrong. `rows` x C of buf are used, per tensor `name_of(i)`.
  auto require_finite = [&](size_t used, const auto& name_of, size_t from = 0) {
    for (size_t i = from; i < from + used; ++i)
      ZT_REQUIRE(std::isfinite(buf[i]), "model.init: " << path << " holds NaN/Inf weights (tensor " << name_of(i - from)
                                                       << ", value " << buf[i] << "); use an intact checkpoint, or set "
                                                       << "model.init to \"\" for a random init");
  };
  const size_t Cs = size_t(C);
  // A tensor rank keeps its slice of each whole tensor the file holds (model/tensor_parallel.h);
  // `whole` points at the tensor's values in the file's layout, `real` of them are not padding.
  auto keep_mine = [&](int k, const float* whole, size_t real) {
    const TensorSlot& s = layout_.tensors()[size_t(k)];
    host.assign(s.numel, M(0));
    for (size_t i = 0; i < s.numel; ++i) {
      const size_t g = global_index(s, cfg_, i);
      if (g < real) host[i] = M(whole[g]);
    }
    sink(k, host.data());
  };
  // llm.c stores each tensor for all layers together: (L, ...) per ParamId.
  for (int id = 0; id < kNumParamIds; ++id) {
    const ParamId pid = ParamId(id);
    if (pid == ParamId::wte || pid == ParamId::wpe) {
      const size_t file_rows = size_t(pid == ParamId::wte ? Vp : maxT);
      const size_t keep_rows = size_t(pid == ParamId::wte ? V : cfg_.maxT);
      read_floats(file_rows * Cs, pid == ParamId::wte ? "wte" : "wpe");
      if (!cfg_.has_embedding()) continue;  // a middle pipeline stage's
      require_finite(keep_rows * Cs, [&](size_t) { return layout_.slot(pid).name; });
      keep_mine(layout_.tensor_index(pid, -1), buf.data(), keep_rows * Cs);  // padding rows stay zero
    } else if (pid == ParamId::lnfw || pid == ParamId::lnfb) {
      read_floats(Cs, "ln_f");
      if (!cfg_.last_stage) continue;  // the last pipeline stage's
      require_finite(Cs, [&](size_t) { return layout_.slot(pid).name; });
      host.assign(buf.begin(), buf.end());
      sink(layout_.tensor_index(pid, -1), host.data());
    } else {
      // The file's tensor is the whole one: tp times this rank's slice where it is split.
      // A pipeline stage keeps its layers of the file's (the whole model's): block l is layer
      // whole_layer(l) (runs of them with interleaved chunks).
      const size_t per_layer = layout_.slot(pid, 0).numel * size_t(split_over_tensor(pid) ? cfg_.tp : 1);
      read_floats(per_layer * size_t(L), layout_.slot(pid, 0).name.c_str());
      for (int l = 0; l < cfg_.L; ++l) {
        const size_t at = size_t(cfg_.whole_layer(l)) * per_layer;
        require_finite(per_layer, [&](size_t) { return layout_.slot(pid, l).name; }, at);
        keep_mine(layout_.tensor_index(pid, l), buf.data() + at, per_layer);
      }
    }
  }
  char extra;
  ZT_REQUIRE(std::fread(&extra, 1, 1, f.get()) == 0, "model.init: " << path << " has trailing bytes after the 16 tensors");
}

template <class Ops>
void GPT<Ops>::save_llmc(const std::string& path) {
  const ParamLayout whole(cfg_.whole(), 1);
  LlmcWriter w(path, whole);
  save_llmc_units([&](int k, const float* v, size_t begin, size_t n) { w.write(k, v, begin, n); },
                  [&](int u) -> const T* { return unit_param_[size_t(u)]; });
  w.finish();
}

template <class Ops>
void GPT<Ops>::save_llmc_units(const LlmcSink& sink, const std::function<const T*(int u)>& unit_params) const {
  // The file holds whole tensors (llm.c knows no split). With tensor parallelism every rank of a
  // tensor group sends its slice of each split tensor to the others (host bytes, once, at the end
  // of a run; every group does it, the writer's group is the one that counts), and the writer (tensor
  // rank 0) puts each element where global_index says; replicated tensors are tensor rank 0's.
  const int tp = cfg_.tp;
  const bool writer = bool(sink);
  ZT_ASSERT(tp == 1 || tensor_group_ != nullptr);
  ZT_ASSERT(!writer || cfg_.tp_rank == 0);
  std::vector<float> buf;
  std::vector<M> host;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const T* p = unit_params(u);  // collective at stage 3: every rank asks for every unit
    if (!writer && tp == 1) continue;
    const Unit& unit = layout_.units()[size_t(u)];
    for (int k : unit.tensors) {
      const UnitPiece pc = layout_.piece(u, k);  // a unit may hold part of a tensor (embedding chunks)
      const TensorSlot& s = layout_.tensors()[size_t(k)];
      if (!cfg_.first_stage && (s.id == ParamId::wte || s.id == ParamId::wpe)) continue;  // the first stage's
      const int kw = layout_.whole_tensor_index(k);
      host.resize(pc.count);
      download(host.data(), p + pc.at, pc.count);
      buf.assign(host.begin(), host.end());
      if (tp == 1 || !split_over_tensor(s.id)) {
        if (writer) sink(kw, buf.data(), pc.begin, pc.count);
        continue;
      }
      std::vector<float> slice(pc.count);
      for (int q = 0; q < tp; ++q) {
        if (q == cfg_.tp_rank) slice = buf;
        tensor_group_->broadcast_host(slice.data(), slice.size() * sizeof(float), q);
        if (!writer) continue;
        const GPTConfig at_q = cfg_.split(tp, q, cfg_.sp);
        for (size_t i = 0; i < pc.count;) {
          const size_t run = std::min(global_run(s, at_q, pc.begin + i), pc.count - i);
          sink(kw, slice.data() + i, global_index(s, at_q, pc.begin + i), run);
          i += run;
        }
      }
    }
  }
}

LlmcWriter::LlmcWriter(const std::string& path, const ParamLayout& layout) : path_(path), layout_(layout) {
  // Failures here are the user's disk or path (full, read-only, gone), so the message names the
  // file and the system's reason, never our source line.
  f_.reset(std::fopen(path.c_str(), "wb"));
  ZT_REQUIRE(f_, "cannot create " << path << ": " << std::strerror(errno));
  const GPTConfig& cfg = layout.config();
  int header[256] = {};
  header[0] = kModelMagic; header[1] = kModelVersionFp32;
  header[2] = cfg.maxT; header[3] = cfg.V; header[4] = cfg.L; header[5] = cfg.NH; header[6] = cfg.C; header[7] = cfg.Vp;
  ZT_REQUIRE(std::fwrite(header, sizeof(int), 256, f_.get()) == 256, "cannot write " << path << ": " << std::strerror(errno));
  // llm.c stores each tensor for all layers together (ParamId-major).
  at_.resize(layout.tensors().size());
  size_t pos = 256 * sizeof(int);
  for (int id = 0; id < kNumParamIds; ++id) {
    const ParamId pid = ParamId(id);
    const bool global = pid == ParamId::wte || pid == ParamId::wpe || pid == ParamId::lnfw || pid == ParamId::lnfb;
    for (int l = global ? -1 : 0; l < (global ? 0 : cfg.L); ++l) {
      const int k = layout.tensor_index(pid, l);
      at_[size_t(k)] = pos;
      pos += layout.tensors()[size_t(k)].numel * sizeof(float);
    }
  }
}

void LlmcWriter::write(int k, const float* values, size_t begin, size_t count) {
  const size_t numel = layout_.tensors()[size_t(k)].numel;
  const size_t n = count == kWhole ? numel : count;
  ZT_ASSERT(begin + n <= numel);
  ZT_REQUIRE(::fseeko(f_.get(), off_t(at_[size_t(k)] + begin * sizeof(float)), SEEK_SET) == 0 &&
                 std::fwrite(values, sizeof(float), n, f_.get()) == n,
             "cannot write " << path_ << ": " << std::strerror(errno));
}

void LlmcWriter::finish() {
  // A crash must not leave a complete-looking name over an empty file; fclose reports what the
  // kernel could not write back.
  auto wrote = [&](bool ok) { ZT_REQUIRE(ok, "cannot write " << path_ << ": " << std::strerror(errno)); };
  wrote(std::fflush(f_.get()) == 0);
  wrote(::fsync(::fileno(f_.get())) == 0);
  wrote(std::fclose(f_.release()) == 0);
}

template <class Ops>
size_t GPT<Ops>::llmc_file_bytes(const GPTConfig& cfg) {
  const ParamLayout layout(cfg.whole(), 1);  // a tensor-parallel rank writes the whole model too
  size_t n = 0;
  for (const TensorSlot& s : layout.tensors()) n += s.numel;
  return 256 * sizeof(int) + n * sizeof(float);
}

// The members defined here, for the op tables gpt.cpp instantiates the class for.
#define ZT_GPT_IO(OPS)                                                                                                   \
  template void GPT<OPS>::load_llmc(const std::string&);                                                               \
  template void GPT<OPS>::read_llmc(const std::string&, const std::function<void(int, const OPS::M*)>&) const;              \
  template void GPT<OPS>::save_llmc(const std::string&);                                                               \
  template void GPT<OPS>::save_llmc_units(const LlmcSink&, const std::function<const OPS::T*(int)>&) const;        \
  template size_t GPT<OPS>::llmc_file_bytes(const GPTConfig&);
ZT_GPT_IO(CpuOps<float>)
ZT_GPT_IO(CpuOps<double>)
#if ZT_HAVE_CUDA
ZT_GPT_IO(CudaOps<float>)
ZT_GPT_IO(CudaOps<bf16>)
#endif
#undef ZT_GPT_IO

}  // namespace zt
