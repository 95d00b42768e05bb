// run.trace (docs/traces.md) around the ZeRO engine: the engine's hooks carry no trace
// code; with a tracer the model calls TracedHooks, which calls the engine's hooks and draws forward
// / backward per unit on the compute track. The step's parts outside the hooks (finish gradients,
// grad norm, AdamW, parameter all-gather) are TraceSpans. The bucket / unit of each collective are
// tags its issuer adds (GradReducer, ParamGatherer, EmbeddingExchange).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "runtime/trace.h"

namespace zt {

// One complete event from construction to destruction; nothing when tr is nullptr.
struct TraceSpan {
  TraceSpan(Tracer* tr, const char* name, int track)
      : tr(tr), name(name), track(track), t0(tr ? Tracer::now_us() : 0) {}
  ~TraceSpan() {
    if (tr) tr->complete(name, track, t0, Tracer::now_us() - t0, args);
  }
  Tracer* tr;
  const char* name;
  int track;
  double t0;
  std::string args;  // JSON members for the event (Tracer::complete)
};

// A unit's span starts after the hook that opens it has done its own work (a gather's wait, a
// staging slot's completion) and ends before the next hook's: it is the unit's compute.
class TracedHooks : public UnitHooks {
 public:
  // micro: the engine's current micro-step, read at each span.
  TracedHooks(UnitHooks& inner, Tracer& tr, const int& micro) : in_(inner), tr_(tr), micro_(micro) {}

  void before_forward(int u) override {
    in_.before_forward(u);
    in_forward_ = true;
    t0_ = Tracer::now_us();
  }
  void after_forward(int u) override {
    span("fwd u", u);
    in_forward_ = false;
    in_.after_forward(u);
  }
  void before_backward(int u) override {
    in_.before_backward(u);
    in_backward_ = true;
    t0_ = Tracer::now_us();
  }
  void before_grads(int u) override {
    in_.before_grads(u);
    if (grads_opened_at_.size() <= size_t(u)) grads_opened_at_.resize(size_t(u) + 1, 0);
    grads_opened_at_[size_t(u)] = spans_closed_;
    // Gradients written without parameters (the embedding's, last) are a backward span of their own.
    // Opened at the start of a unit's span (its backward, or a chunked classifier's forward,
    // model/gpt.h), they belong to that span, which starts after this hook's own wait.
    grads_span_ = !in_backward_ && !in_forward_;
    t0_ = Tracer::now_us();
  }
  void grads_ready(int u) override {
    if (grads_span_) span("bwd u", u);
    // A unit whose gradients opened inside its backward span but complete after other units' spans
    // (a chunked classifier's embedding, model/gpt.h) gets a span for that last part: from the
    // last span's end to its grads_ready.
    if (!grads_span_ && !in_backward_ && size_t(u) < grads_opened_at_.size() &&
        spans_closed_ - grads_opened_at_[size_t(u)] > 1) {
      t0_ = last_close_t_;
      span("bwd u", u);
    }
    grads_span_ = false;
    in_.grads_ready(u);
  }
  void after_backward(int u) override {
    span("bwd u", u);
    in_backward_ = false;
    ++spans_closed_;
    last_close_t_ = Tracer::now_us();
    in_.after_backward(u);
  }
  void embedding_lookup_deferred() override {
    TraceSpan s(&tr_, "embedding lookup gradient", Tracer::kCompute);
    in_.embedding_lookup_deferred();
  }
  // The head over rows as they arrive: its forward is one span per stretch between waits (a wait
  // for rows is not compute), the last one closed by after_forward.
  std::vector<VocabRows> head_rows(int u) override { return in_.head_rows(u); }
  void before_head_rows(int u, int k) override {
    if (k > 0) span("fwd u", u);
    in_.before_head_rows(u, k);
    t0_ = Tracer::now_us();
  }

 private:
  void span(const char* what, int u) {
    tr_.complete(what + std::to_string(u), Tracer::kCompute, t0_, Tracer::now_us() - t0_,
                 "\"unit\":" + std::to_string(u) + ",\"micro\":" + std::to_string(micro_));
  }

  UnitHooks& in_;
  Tracer& tr_;
  const int& micro_;
  bool in_forward_ = false, in_backward_ = false, grads_span_ = false;
  double t0_ = 0;  // start of the open span
  uint64_t spans_closed_ = 0;
  std::vector<uint64_t> grads_opened_at_;  // per unit: spans_closed_ at its before_grads
  double last_close_t_ = 0;
};

}  // namespace zt
