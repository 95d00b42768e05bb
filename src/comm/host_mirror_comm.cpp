#include "comm/host_mirror_comm.h"

#if ZT_HAVE_CUDA
#include <algorithm>
#include <functional>
#include <utility>

#include "runtime/cuda_context.h"
#include "runtime/trace.h"

namespace zt {

// One collective between issue() and finish(). Host ranges are the mirror elements it uses (send
// and receive), so that two collectives in flight never share mirror memory.
struct HostMirrorComm::Op {
  std::function<CommHandle()> start;   // the inner collective, on the mirrors
  std::function<void()> widen, narrow;  // host work before start / after completion (bf16 reductions)
  void* h2d_dst = nullptr;              // result back to the device
  const void* h2d_src = nullptr;
  size_t h2d_bytes = 0;
  std::vector<std::pair<const float*, const float*>> host;
  cudaEvent_t staged = nullptr;  // device-to-host copies done
  CommHandle inner;
  bool started = false;
  std::string tags;       // run.trace: the issuer's tags (bucket, unit), for the inner collective
  double d2h_us = 0;      // run.trace: when the device-to-host copies were issued
  size_t d2h_bytes = 0;
};

namespace {
cudaStream_t compute() { return cuda::Context::get().stream; }

// bf16 held in the upper half of an fp32 range of n elements, widened in place, going forward:
// float i (bytes 4i..4i+3) overwrites bf16 n+j only for j < i + 1 (read already).
void widen_in_place(float* f, size_t n) {
  const bf16* b = reinterpret_cast<const bf16*>(f) + n;
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(b[i]);
}
// The reverse, into the lower half: bf16 i (bytes 2i..2i+1) lies inside float i/2, already read.
void narrow_in_place(float* f, size_t n) {
  bf16* b = reinterpret_cast<bf16*>(f);
  for (size_t i = 0; i < n; ++i) b[i] = __float2bfloat16(f[i]);
}
}  // namespace

HostMirrorComm::HostMirrorComm(Comm& inner, std::vector<MirroredRegion> regions, int elem_bytes)
    : inner_(inner), es_(size_t(elem_bytes)), regions_(std::move(regions)) {
  ZT_ASSERT(es_ == 2 || es_ == 4);
  if (inner_.world() == 1) return;  // device-to-device copies, no mirror
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
}

HostMirrorComm::~HostMirrorComm() {
  // Nothing is left in flight on a normal exit; after an error the process is going down anyway.
  for (auto& [id, op] : ops_)
    if (op->staged) (void)cudaEventDestroy(op->staged);
  if (copy_) {
    (void)cudaStreamSynchronize(copy_);
    (void)cudaStreamDestroy(copy_);
  }
}

float* HostMirrorComm::mirror(const void* dev, size_t n) const {
  const char* p = static_cast<const char*>(dev);
  for (const MirroredRegion& r : regions_) {
    const char* dev = static_cast<const char*>(r.device);
    if (p < dev || p >= dev + r.numel * es_) continue;
    const size_t k = size_t(p - dev) / es_;
    ZT_ASSERT(size_t(p - dev) % es_ == 0 && k + n <= r.numel);
    return r.host + k;
  }
  fail_at(__FILE__, __LINE__, "internal error: HostMirrorComm: a collective on a device buffer that has no host mirror");
}

void HostMirrorComm::start_ready(uint64_t upto) {
  for (auto& [id, op] : ops_) {
    if (op->started) continue;
    if (id <= upto) {
      ZT_CHECK_CUDA(cudaEventSynchronize(op->staged));
    } else {
      const cudaError_t rc = cudaEventQuery(op->staged);
      if (rc == cudaErrorNotReady) return;  // in issue order: nothing after it starts either
      ZT_CHECK_CUDA(rc);
    }
    if (tr_) {
      const double now = Tracer::now_us();
      tr_->complete("d2h", Tracer::kCopy, op->d2h_us, now - op->d2h_us, "\"bytes\":" + std::to_string(op->d2h_bytes));
    }
    if (op->widen) op->widen();
    if (tr_) {
      std::string issuing = tr_->take_tags();  // a collective being issued now keeps its own
      tr_->put_tags(std::move(op->tags));
      op->inner = op->start();
      tr_->put_tags(std::move(issuing));
    } else {
      op->inner = op->start();
    }
    op->started = true;
  }
}

void HostMirrorComm::finish(uint64_t id) {
  auto it = ops_.find(id);
  Op& op = *it->second;
  if (op.narrow) op.narrow();
  if (op.h2d_bytes) {
    // After the compute stream's work so far: it may still be reading the receive buffer's previous
    // contents (a staging slot's last result).
    ZT_CHECK_CUDA(cudaEventRecord(op.staged, compute()));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(copy_, op.staged, 0));
    ZT_CHECK_CUDA(cudaMemcpyAsync(op.h2d_dst, op.h2d_src, op.h2d_bytes, cudaMemcpyHostToDevice, copy_));
    if (tr_) tr_->instant("h2d", Tracer::kCopy, Tracer::now_us(), "\"bytes\":" + std::to_string(op.h2d_bytes));
  }
  // The compute stream may now overwrite the send buffer (the D2H read it) and read the result.
  ZT_CHECK_CUDA(cudaEventRecord(op.staged, copy_));
  ZT_CHECK_CUDA(cudaStreamWaitEvent(compute(), op.staged, 0));
  ZT_CHECK_CUDA(cudaEventDestroy(op.staged));
  ops_.erase(it);
}

void HostMirrorComm::wait(CommHandle h) {
  if (!h.valid() || !ops_.count(h.seq)) return;
  start_ready(h.seq);
  inner_.wait(ops_.at(h.seq)->inner);
  finish(h.seq);
}

bool HostMirrorComm::test(CommHandle h) {
  start_ready(0);
  inner_.test(CommHandle{});
  if (!h.valid() || !ops_.count(h.seq)) return true;
  Op& op = *ops_.at(h.seq);
  if (!op.started || !inner_.test(op.inner)) return false;
  finish(h.seq);
  return true;
}

CommHandle HostMirrorComm::broadcast(void* buf, size_t bytes, int root) {
  for (const MirroredRegion& r : regions_) {
    const char* dev = static_cast<const char*>(r.device);
    ZT_ASSERT(!(static_cast<const char*>(buf) >= dev && static_cast<const char*>(buf) < dev + r.numel * es_));
  }
  return inner_.broadcast(buf, bytes, root);
}

// ---- the three collectives: mirrors, copies, and what runs on the host around them -------------

CommHandle HostMirrorComm::local() {
  if (tr_) tr_->take_tags();
  return {};
}

CommHandle HostMirrorComm::submit(std::unique_ptr<Op> op, const std::vector<Copy>& d2h) {
  if (tr_) op->tags = tr_->take_tags();  // before waiting for an earlier collective starts that one
  // A collective still using any of these mirror elements (the same unit gathered twice in flight)
  // finishes first: a mirror range belongs to one collective at a time.
  for (bool again = true; again;) {
    again = false;
    for (auto& [id, o] : ops_) {
      for (auto& a : o->host)
        for (auto& b : op->host) again |= a.first < b.second && b.first < a.second;
      if (again) {
        wait(CommHandle{id});
        break;
      }
    }
  }
  // The device-to-host copies follow the compute stream's work so far; the event marks their end.
  ZT_CHECK_CUDA(cudaEventCreateWithFlags(&op->staged, cudaEventDisableTiming));
  ZT_CHECK_CUDA(cudaEventRecord(op->staged, compute()));
  ZT_CHECK_CUDA(cudaStreamWaitEvent(copy_, op->staged, 0));
  if (tr_) op->d2h_us = Tracer::now_us();
  for (const Copy& c : d2h) {
    ZT_CHECK_CUDA(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToHost, copy_));
    op->d2h_bytes += c.bytes;
  }
  ZT_CHECK_CUDA(cudaEventRecord(op->staged, copy_));
  const uint64_t id = next_id_++;
  ops_.emplace(id, std::move(op));
  start_ready(0);
  return CommHandle{id};
}

CommHandle HostMirrorComm::all_reduce(float* buf, size_t n) {
  if (world() == 1 || n == 0) return local();
  auto op = std::make_unique<Op>();
  float* h = mirror(buf, n);
  op->host = {{h, h + n}};
  op->h2d_dst = buf, op->h2d_src = h, op->h2d_bytes = n * es_;
  op->start = [this, h, n] { return inner_.all_reduce(h, n); };
  if (es_ == 4) return submit(std::move(op), {{h, buf, 4 * n}});
  // bf16: the values land in the upper half of the fp32 range, are widened there and summed in fp32.
  op->widen = [h, n] { widen_in_place(h, n); };
  op->narrow = [h, n] { narrow_in_place(h, n); };
  return submit(std::move(op), {{reinterpret_cast<bf16*>(h) + n, buf, 2 * n}});
}

CommHandle HostMirrorComm::reduce_scatter(const float* send, float* recv, size_t recv_n) {
  const size_t N = size_t(world()), n = recv_n;
  if (N == 1 || n == 0) {
    if (n && send != recv) ZT_CHECK_CUDA(cudaMemcpyAsync(recv, send, n * es_, cudaMemcpyDeviceToDevice, compute()));
    return local();
  }
  // The engine never reduce-scatters in place (staging slot -> receive slot, gradients -> shard).
  auto op = std::make_unique<Op>();
  float* hs = mirror(send, N * n);
  float* hr = mirror(recv, n);
  op->host = {{hs, hs + N * n}, {hr, hr + n}};
  op->h2d_dst = recv, op->h2d_src = hr, op->h2d_bytes = n * es_;
  op->start = [this, hs, hr, n] { return inner_.reduce_scatter(hs, hr, n); };
  if (es_ == 4) return submit(std::move(op), {{hs, send, 4 * N * n}});
  op->widen = [hs, N, n] { widen_in_place(hs, N * n); };
  op->narrow = [hr, n] { narrow_in_place(hr, n); };
  return submit(std::move(op), {{reinterpret_cast<bf16*>(hs) + N * n, send, 2 * N * n}});
}

CommHandle HostMirrorComm::all_gather(const float* send, float* recv, size_t send_n) {
  const size_t N = size_t(world()), n = send_n, r = size_t(rank());
  const char* s = reinterpret_cast<const char*>(send);
  char* d = reinterpret_cast<char*>(recv);
  const bool in_place = s == d + r * n * es_;
  if (N == 1 || n == 0) {
    if (n && !in_place) ZT_CHECK_CUDA(cudaMemcpyAsync(recv, send, n * es_, cudaMemcpyDeviceToDevice, compute()));
    return local();
  }
  // A copy, not arithmetic: bf16 moves as it is, two elements per float, packed at the start of
  // each mirror range. A shard is a multiple of 128 / gcd(N, 128) elements (units are padded to
  // lcm(N, 128)): even below 128 ranks.
  ZT_REQUIRE(es_ == 4 || n % 2 == 0,
             "bf16 all-gather of an odd shard (" << n << " elements): use fewer than 128 ranks or fp32");
  const size_t w = es_ == 4 ? n : n / 2;  // floats per rank on the wire
  auto op = std::make_unique<Op>();
  float* hr = mirror(recv, N * n);
  float* hs = in_place ? hr + r * w : mirror(send, n);
  op->host = {{hr, hr + N * n}};
  if (!in_place) op->host.push_back({hs, hs + n});
  op->h2d_dst = recv, op->h2d_src = hr, op->h2d_bytes = N * n * es_;
  op->start = [this, hs, hr, w] { return inner_.all_gather(hs, hr, w); };
  return submit(std::move(op), {{hs, send, n * es_}});
}

// ---- groups and point to point ------------------------------------------------------------------

HostMirrorComm::HostMirrorComm(std::unique_ptr<Comm> inner, const HostMirrorComm& parent)
    : inner_(*inner), es_(parent.es_), regions_(parent.regions_) {
  owned_inner_ = std::move(inner);
  if (inner_.world() > 1) ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
}

std::unique_ptr<Comm> HostMirrorComm::split(int color, int key, const std::string& name) {
  std::unique_ptr<HostMirrorComm> group(new HostMirrorComm(inner_.split(color, key, name), *this));
  group->tr_ = tr_;  // the inner group has the tracer already (its parent's)
  return group;
}

float* HostMirrorComm::p2p_buffer(size_t bytes, uint64_t id) {
  for (auto it = p2p_bufs_.begin(); it != p2p_bufs_.end();)  // those of finished ops go
    it = ops_.count(it->first) ? std::next(it) : p2p_bufs_.erase(it);
  void* p = nullptr;
  ZT_CHECK_CUDA(cudaMallocHost(&p, std::max<size_t>(bytes, 4)));
  p2p_bufs_[id] = std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
  return static_cast<float*>(p);
}

CommHandle HostMirrorComm::send(const void* buf, size_t bytes, int peer) {
  float* h = bytes ? p2p_buffer(bytes, next_id_) : nullptr;  // submit gives the op id next_id_
  auto op = std::make_unique<Op>();
  op->start = [this, h, bytes, peer] { return inner_.send(h, bytes, peer); };
  if (!bytes) return submit(std::move(op), {});
  return submit(std::move(op), {{h, buf, bytes}});
}

CommHandle HostMirrorComm::recv(void* buf, size_t bytes, int peer) {
  float* h = bytes ? p2p_buffer(bytes, next_id_) : nullptr;
  auto op = std::make_unique<Op>();
  op->h2d_dst = buf, op->h2d_src = h, op->h2d_bytes = bytes;
  op->start = [this, h, bytes, peer] { return inner_.recv(h, bytes, peer); };
  return submit(std::move(op), {});
}

}  // namespace zt
#endif
