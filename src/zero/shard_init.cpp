// Stage 3's parameter initialisation, shard-wise (docs/design.md §3.3, §3.6): each rank computes
// and writes only the ranges of its own shard (StateBuffer::holds), never the whole model, wherever
// the store keeps that shard: device memory, pinned host memory (offload.params "cpu", CUDA
// backend) or a swap file (offload.params "nvme").
#include "zero/shard_init.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"

namespace zt {

namespace {

template <class Ops>
void init_shard_file(GPT<Ops>& model, const StateStore& store, uint64_t seed, offload::SwapFile& file) {
  using T = typename Ops::T;
  // The file in whole aligned pieces, each holding every range of my shard that falls in it (zeros
  // between them, as the file was created), written (O_DIRECT, no bounce buffer) while the next
  // piece is computed on the OpenMP threads: the values depend only on (seed, tensor, element), so
  // the pieces' order changes nothing, and no tensor range of the largest model is a transient of
  // its own (wte: V x C).
  using M = typename Ops::M;
  constexpr size_t kPiece = size_t(1) << 20;  // elements, a whole number of blocks
  static_assert(kPiece * sizeof(T) % offload::kIoAlign == 0);
  const std::vector<TensorRange>& holds = store.info(StateId::param_shard).holds;
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> bufs[2] = {
      std::unique_ptr<T, Free>(static_cast<T*>(std::aligned_alloc(offload::kIoAlign, kPiece * sizeof(T)))),
      std::unique_ptr<T, Free>(static_cast<T*>(std::aligned_alloc(offload::kIoAlign, kPiece * sizeof(T))))};
  ZT_REQUIRE(bufs[0] && bufs[1], "out of memory for the parameter file's initialisation buffers");
  std::vector<M> narrow(std::is_same_v<T, M> ? 0 : kPiece);  // the CUDA backend's bf16: values before rounding
  std::future<void> writing[2];
  const size_t file_bytes = file.file_bytes();
  for (size_t p = 0; p * kPiece * sizeof(T) < file_bytes; ++p) {
    T* buf = bufs[p % 2].get();
    if (writing[p % 2].valid()) writing[p % 2].get();  // the buffer's previous piece is on disk
    const size_t lo = p * kPiece, hi = lo + kPiece, len = std::min(kPiece * sizeof(T), file_bytes - lo * sizeof(T));
    std::memset(buf, 0, len);
    for (const TensorRange& r : holds) {
      const size_t a = std::max(lo, r.at), b = std::min(hi, r.at + r.count);
      if (a >= b) continue;
      if constexpr (std::is_same_v<T, M>) {
        model.init_gpt2_values(seed, r.tensor, r.offset + (a - r.at), b - a, buf + (a - lo));
      } else {
        model.init_gpt2_values(seed, r.tensor, r.offset + (a - r.at), b - a, narrow.data());
        for (size_t i = 0; i < b - a; ++i) buf[a - lo + i] = T(narrow[i]);
      }
    }
    writing[p % 2] = std::async(std::launch::async, [&file, buf, len, lo] { file.write_blocks(buf, len, lo * sizeof(T)); });
  }
  for (std::future<void>& w : writing)
    if (w.valid()) w.get();
}

}  // namespace

template <class Ops>
void init_param_shard(GPT<Ops>& model, const StateStore& store, uint64_t seed, const std::string& llmc_path) {
  using T = typename Ops::T;
  const StateBuffer& shard = store.info(StateId::param_shard);
  T* dst = store.get<T>(StateId::param_shard);
  using M = typename Ops::M;
  offload::SwapFile* file = store.file(StateId::param_shard);  // offload.params nvme: write the file
  // offload.params "cpu" (CUDA backend): the shard is pinned host memory, written in place.
  auto put = [pinned = shard.tier == Tier::pinned](T* to, const M* values, size_t n) {
    if (!pinned) return GPT<Ops>::upload(to, values, n);
    for (size_t i = 0; i < n; ++i) to[i] = T(values[i]);
  };
  // Into the swap file at element `at`: as T (the CUDA backend's bf16, rounded as put() rounds).
  std::vector<T> narrow;
  auto put_file = [&](size_t at, const M* values, size_t n) {
    if constexpr (std::is_same_v<T, M>) {
      file->write_at(values, n * sizeof(M), at * sizeof(T));
    } else {
      narrow.resize(n);
      for (size_t i = 0; i < n; ++i) narrow[i] = T(values[i]);
      file->write_at(narrow.data(), n * sizeof(T), at * sizeof(T));
    }
  };
  if (file && llmc_path.empty()) {
    init_shard_file(model, store, seed, *file);
  } else if (llmc_path.empty()) {
    std::vector<M> host;
    for (const TensorRange& r : shard.holds) {
      host.resize(r.count);
      model.init_gpt2_values(seed, r.tensor, r.offset, r.count, host.data());
      put(dst + r.at, host.data(), r.count);
    }
  } else {
    model.read_llmc(llmc_path, [&](int k, const M* values) {
      for (const TensorRange& r : shard.holds) {
        if (r.tensor != k) continue;
        if (file) put_file(r.at, values + r.offset, r.count);
        else put(dst + r.at, values + r.offset, r.count);
      }
    });
  }
}

template void init_param_shard(GPT<CpuOps<float>>&, const StateStore&, uint64_t, const std::string&);
#if ZT_HAVE_CUDA
template void init_param_shard(GPT<CudaOps<float>>&, const StateStore&, uint64_t, const std::string&);
template void init_param_shard(GPT<CudaOps<bf16>>&, const StateStore&, uint64_t, const std::string&);
#endif

}  // namespace zt
