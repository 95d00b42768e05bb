#include "zero/param_gatherer.h"

#include <algorithm>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "comm/comm_ptr.h"

namespace zt {

template <class Ops>
ParamGatherer<Ops>::ParamGatherer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm)
    : model_(model), layout_(model.layout()), part_(part), store_(store), comm_(comm), rules_(part.rules()) {
  if (!rules_.gather_units) return;
  T* base = store.get<T>(StateId::gathered_units);
  for (size_t i = 0; i < part.gather_slots(); ++i) {
    GatherSlot g;
    g.buf = base;
    g.numel = part.gather_slot_numel(i);
    base += g.numel;
    slots_.push_back(g);
  }
  std::vector<T*> bufs;
  for (const GatherSlot& g : slots_) bufs.push_back(g.buf);
  shards_ = std::make_unique<ParamShardSource<Ops>>(layout_, part, store, std::move(bufs),
                                                    [this](int slot, const T* shard) { launch_gather(slot, shard); });
}

template <class Ops>
void ParamGatherer<Ops>::launch_gather(int slot, const T* shard) {
  GatherSlot& s = slots_[size_t(slot)];
  if (tr_) {
    tr_->tag_next("unit", s.unit);
    tr_->tag_next("prefetch", s.first != pos_);
  }
  s.h = gather(s.unit, shard, s.buf);
}

template <class Ops>
typename ParamGatherer<Ops>::GatherSlot* ParamGatherer<Ops>::free_slot_for(int u) {
  GatherSlot* best = nullptr;
  for (GatherSlot& g : slots_)
    if (g.unit < 0 && g.numel >= part_.unit_padded(u) && (!best || g.numel < best->numel)) best = &g;
  return best;
}

template <class Ops>
CommHandle ParamGatherer<Ops>::gather(int u, const T* src, T* dst) {
  return comm_.all_gather(comm_ptr(src), comm_ptr(dst), part_.unit_shard_numel(u));
}

template <class Ops>
void ParamGatherer<Ops>::begin_pass(bool with_backward) {
  if (!rules_.gather_units) return;
  // The order in which the model reads units' parameters (UnitHooks, model/gpt.h): forward E-1..0
  // (lookup), blocks, final norm, 0..E-1 (LM head); backward E-1..0 (LM head), final norm, blocks
  // in reverse. The embedding's gradients need no parameters, so nothing is gathered for them
  // (unless the classifier is chunked, below).
  const int U = layout_.num_units(), E = layout_.embedding_units();
  sched_.clear();
  for (int u = E - 1; u >= 0; --u) sched_.push_back(u);
  for (int u = E; u < U; ++u) sched_.push_back(u);
  for (int u = 0; u < E; ++u) sched_.push_back(u);
  forward_positions_ = int(sched_.size());
  if (with_backward) {
    for (int u = E - 1; u >= 0; --u) sched_.push_back(u);
    for (int u = U - 1; u >= E; --u) sched_.push_back(u);
    // A chunked classifier over a split embedding recomputes each unit's logits for its gradient
    // (model/gpt.h): E-1..0 once more, at the end.
    if (part_.config().classifier_regather)
      for (int u = E - 1; u >= 0; --u) sched_.push_back(u);
  }
  pos_ = 0;
  for (GatherSlot& g : slots_) ZT_ASSERT(g.unit < 0);
  ZT_ASSERT(ordered_.empty());
}

template <class Ops>
void ParamGatherer<Ops>::start(int pos, GatherSlot& s) {
  const int u = sched_[size_t(pos)];
  s.unit = u;
  s.first = s.last = pos;
  while (s.last + 1 < int(sched_.size()) && sched_[size_t(s.last + 1)] == u) ++s.last;
  shards_->request(u, int(&s - slots_.data()));  // in memory: the all-gather starts now
  int alive = 0;
  for (const GatherSlot& g : slots_) alive += g.unit >= 0;
  max_alive_ = std::max(max_alive_, alive);
}

template <class Ops>
void ParamGatherer<Ops>::prefetch() {
  if (!part_.config().overlap) return;
  // Next positions not yet covered by a slot, up to prefetch_units gathers ahead.
  int covered = pos_;
  for (const GatherSlot& g : slots_)
    if (g.unit >= 0) covered = std::max(covered, g.last);
  // In schedule order: a unit with no free slot that fits stops the prefetch (so the positions
  // covered are always a prefix, and an uncovered use finds every slot free).
  for (int j = covered + 1; j < int(sched_.size());) {
    GatherSlot* free_slot = free_slot_for(sched_[size_t(j)]);
    if (!free_slot) break;
    start(j, *free_slot);
    j = free_slot->last + 1;
  }
}

template <class Ops>
void ParamGatherer<Ops>::use(int u) {
  ZT_ASSERT(pos_ < int(sched_.size()) && sched_[size_t(pos_)] == u);
  auto it = std::find_if(slots_.begin(), slots_.end(),
                         [&](const GatherSlot& g) { return g.unit == u && g.first <= pos_ && pos_ <= g.last; });
  if (it == slots_.end()) {
    GatherSlot* g = free_slot_for(u);
    ZT_ASSERT(g);
    start(pos_, *g);
    it = slots_.begin() + (g - slots_.data());
  }
  prefetch();  // start the next gathers before blocking on this one
  shards_->deliver(int(it - slots_.begin()));
  // Read by the unit's kernels only: the compute stream waits (NCCL), the host goes on enqueuing;
  // release() waits on the host where the pass next blocks.
  if (part_.config().overlap) {
    comm_.order_compute_after(it->h);
    ordered_.push_back(it->h);
  } else {
    comm_.wait(it->h);  // the naive path: waited on the spot
  }
  it->h = CommHandle{};
  model_.set_unit_params(u, it->buf);
}

template <class Ops>
void ParamGatherer<Ops>::release(int u) {
  shards_->deliver(-1);
  for (GatherSlot& g : slots_) {
    if (g.unit == u && g.first <= pos_ && pos_ <= g.last) {
      if (pos_ == g.last) {
        g.unit = -1;
        model_.set_unit_params(u, nullptr);
        if (tr_) tr_->instant("release u" + std::to_string(u), Tracer::kCompute, Tracer::now_us(), "\"unit\":" + std::to_string(u));
      }
      break;
    }
  }
  ++pos_;
  // The end of the forward (the loss is read next) and of the pass: the host waits for the gathers
  // only the compute stream waited for, so that a hung one ends in a timeout.
  if (pos_ == forward_positions_ || pos_ == int(sched_.size())) comm_.wait_all(ordered_);
}

template <class Ops>
void ParamGatherer<Ops>::after_optimizer_step() {
  if (!rules_.gather_params) return;
  // Everyone updated its shard of the full parameters in place; all-gather them back, unit by
  // unit in the order forward uses them (the comm thread starts them in that order, a few at a
  // time, comm/mpi_thread.h). Where the lookup reads the shards (EmbeddingExchange), forward needs the
  // embedding (unit 0, the largest) only at the LM head, after every block: it goes last, so the
  // first block does not wait for it to cross the link.
  ZT_ASSERT(!params_pending());
  const int U = layout_.num_units();
  const bool embedding_last = part_.lookup_numel() > 0 && part_.config().overlap && U > 1;
  T* params = store_.get<T>(StateId::params);
  ag_.assign(size_t(U), CommHandle{});
  for (int k = 0; k < U; ++k) {
    const int u = embedding_last ? (k + 1) % U : k;
    T* full = params + layout_.units()[size_t(u)].offset;
    if (tr_) tr_->tag_next("unit", u);
    ag_[size_t(u)] = comm_.all_gather(comm_ptr(full + part_.unit_shard_begin(u)), comm_ptr(full), part_.unit_shard_numel(u));
    if (!part_.config().overlap) comm_.wait(ag_[size_t(u)]);  // the naive path: waited on the spot
  }
  // Only handles still to wait count: a backend may finish a collective on the spot and hand back
  // an empty handle (the staged CUDA path at one rank).
  pending_ = 0;
  if (part_.config().overlap)
    for (const CommHandle& h : ag_) pending_ += h.valid() ? 1 : 0;
  if (!pending_) ag_.clear();
}

template <class Ops>
void ParamGatherer<Ops>::wait_unit(int u) {
  if (!params_pending() || !ag_[size_t(u)].valid()) return;  // nothing in flight for u
  comm_.wait(ag_[size_t(u)]);
  ag_[size_t(u)] = CommHandle{};
  --pending_;
}

template <class Ops>
void ParamGatherer<Ops>::wait_all() {
  for (int u = 0; params_pending() && u < int(ag_.size()); ++u) wait_unit(u);
}

template <class Ops>
std::vector<VocabRows> ParamGatherer<Ops>::head_rows(int u) {
  if (!params_pending() || !ag_[size_t(u)].valid() || layout_.embedding_units() != 1 || u != 0) return {};
  if (!head_ranges_.empty()) return head_ranges_;  // the layout and the partition never change
  std::vector<VocabRows>& ranges = head_ranges_;
  // Row i of wte is whole once every element of it has arrived: the largest arrival position
  // (comm.h's gather_arrival_position) among its last elements in each chunk it touches, plus one.
  const size_t C = size_t(layout_.config().C), n = part_.unit_shard_numel(u);
  const size_t wte0 = layout_.slot(ParamId::wte).offset - layout_.units()[size_t(u)].offset;
  const int rows = layout_.vocab_rows(u).rows, rank = comm_.rank(), world = comm_.world();
  auto need = [&](size_t i) {  // arrived elements row i needs
    const size_t a = wte0 + i * C, b = a + C - 1;
    long long pos = gather_arrival_position(rank, world, n, b);
    for (size_t c = a / n; c < b / n; ++c) pos = std::max(pos, gather_arrival_position(rank, world, n, (c + 1) * n - 1));
    return size_t(pos + 1);
  };
  std::vector<int> order(static_cast<size_t>(rows));
  std::vector<size_t> needs(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) order[size_t(i)] = i, needs[size_t(i)] = need(size_t(i));
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return needs[size_t(x)] < needs[size_t(y)]; });
  // Consecutive rows in arrival order, in ranges: the own rows (need 0) in one, the others in ranges
  // of at most kHeadRangeElems elements and 1/kHeadRanges of the vocabulary, each waited for its
  // last row (small enough that the head follows the ring closely, large enough for a GEMM).
  const int cap = int(std::max<size_t>(1, std::min(kHeadRangeElems / C, size_t(rows) / kHeadRanges)));
  for (int i : order) {
    const size_t ni = needs[size_t(i)];
    if (!ranges.empty()) {
      VocabRows& last = ranges.back();
      const bool own = head_need_.back() == 0;
      if (last.row0 + last.rows == i && ((own && ni == 0) || (!own && ni > 0 && last.rows < cap))) {
        ++last.rows;
        head_need_.back() = std::max(head_need_.back(), ni);
        continue;
      }
    }
    ranges.push_back({i, 1});
    head_need_.push_back(ni);
  }
  // A short range joins the one before it where they are adjacent rows: a narrow GEMM is slow, and
  // BLAS may round it differently from the whole unit's (OpenBLAS's small-matrix kernels).
  for (size_t k = ranges.size(); k-- > 1;) {
    VocabRows &prev = ranges[k - 1], &cur = ranges[k];
    if (cur.rows >= cap / 2 || head_need_[k - 1] == 0 || prev.row0 + prev.rows != cur.row0) continue;
    prev.rows += cur.rows;
    head_need_[k - 1] = std::max(head_need_[k - 1], head_need_[k]);
    ranges.erase(ranges.begin() + long(k));
    head_need_.erase(head_need_.begin() + long(k));
  }
  return ranges;
}

template <class Ops>
void ParamGatherer<Ops>::wait_head_rows(int u, int k) {
  ZT_ASSERT(size_t(k) < head_need_.size());
  if (params_pending() && ag_[size_t(u)].valid() && head_need_[size_t(k)] > 0)
    comm_.wait_all_gather_arrived(ag_[size_t(u)], head_need_[size_t(k)]);
}

template <class Ops>
const typename ParamGatherer<Ops>::T* ParamGatherer<Ops>::whole_unit(int u) {
  if (rules_.full_params) {
    wait_all();
    return store_.get<T>(StateId::params) + layout_.units()[size_t(u)].offset;
  }
  ZT_ASSERT(slots_[0].unit < 0);  // between passes every slot is free
  CommHandle h = gather(u, shards_->now(u, 0), slots_[0].buf);
  comm_.wait(h);
  return slots_[0].buf;
}

template class ParamGatherer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ParamGatherer<CudaOps<float>>;
template class ParamGatherer<CudaOps<bf16>>;
#endif

}  // namespace zt
