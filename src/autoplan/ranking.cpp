#include "autoplan/ranking.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "runtime/output_path.h"

namespace zt::autoplan {

std::string mib(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < (10 << 20) ? 1 : 0) << bytes / double(1 << 20) << " MiB";
  return os.str();
}
std::string ms(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 0.1 ? 1 : 0) << s * 1e3;
  return os.str();
}

void write_plan_and_report(const std::string& out, const nlohmann::json& plan, const std::string& report,
                           const nlohmann::json& rep) {
  write_by_rename({{"--out (its report)", report, nullptr, rep.dump(1) + "\n"}, {"--out", out, nullptr, plan.dump(2) + "\n"}});
}

void print_table(const std::vector<const Candidate*>& rows, bool measured) {
  std::printf("  #  mesh             stage  offload     recompute  B x GA   bucket  overlap |  host/rank  nvme/rank | compute "
              "tensor bubble   comm exposed  I/O  optim |  ms/step   tok/s  bound%s\n",
              measured ? " |  measured  error" : "");
  int i = 0;
  for (const Candidate* c : rows) {
    const Choice& ch = c->choice;
    const Prediction& p = c->pred;
    const double tokens = double(ch.micro_batch) * ch.grad_accum * ch.data * c->resolved["model"]["seq_len"].get<double>();
    char bucket[32] = "-";
    if (ch.data > 1) std::snprintf(bucket, sizeof bucket, "%.2f", ch.bucket_mb);
    std::printf("%3d  %-15s  %5d  %-10s  %-9s  %2d x %-3d %6s  %-7s | %10s %10s | %7s %6s %6s %6s %7s %4s %6s | %8s %7.0f  %-11s",
                ++i, (ch.mesh() + (ch.shard_group != "world" ? " S" + ch.shard_group : "")).c_str(), ch.stage, ch.offload().c_str(), ch.recompute().c_str(), ch.micro_batch,
                ch.grad_accum, bucket, ch.data > 1 ? (ch.overlap ? "on" : "off") : "-", mib(double(c->host)).c_str(),
                mib(double(c->nvme)).c_str(), ms(p.compute_s).c_str(), ms(p.tensor_comm_s).c_str(),
                ms(p.bubble_s + p.p2p_s).c_str(), ms(p.comm_s).c_str(), ms(p.exposed_comm_s).c_str(),
                ms(p.pass_io_s).c_str(), ms(p.optimizer_s).c_str(), ms(p.step_s).c_str(),
                tokens / p.step_s, p.bound.c_str());
    if (measured && c->measured_s > 0)
      std::printf(" | %8s %+5.0f%%", ms(c->measured_s).c_str(), (p.step_s / c->measured_s - 1) * 100);
    std::printf("\n");
  }
}

namespace {

// Why the winner won, against the runner-up: the part of the step that differs most.
std::string why(const Candidate& best, const Candidate* next) {
  std::ostringstream os;
  const Prediction& p = best.pred;
  os << "chosen: " << best.choice.label() << ": " << ms(p.step_s) << " ms/step predicted (compute " << ms(p.compute_s);
  if (best.choice.tensor > 1) os << ", tensor collectives " << ms(p.tensor_comm_s);
  if (best.choice.pipeline > 1) os << ", pipeline bubble " << ms(p.bubble_s) << " and messages " << ms(p.p2p_s);
  os << ", communication waited for " << ms(p.exposed_comm_s) << ", I/O " << ms(p.pass_io_s)
     << ", optimizer step " << ms(p.optimizer_s) << "; " << p.bound << "-bound)";
  if (next) {
    const Prediction& q = next->pred;
    const std::pair<const char*, double> diffs[] = {
        {"compute", q.compute_s - p.compute_s},
        {"tensor collectives", q.tensor_comm_s - p.tensor_comm_s},
        {"pipeline bubble and messages", q.bubble_s + q.p2p_s - p.bubble_s - p.p2p_s},
        {"communication waited for", q.exposed_comm_s - p.exposed_comm_s},
        {"I/O", q.pass_io_s - p.pass_io_s},
        {"optimizer", q.optimizer_s - p.optimizer_s}};
    const auto* most = &diffs[0];
    for (const auto& d : diffs)
      if (std::fabs(d.second) > std::fabs(most->second)) most = &d;
    os << "\nnext: " << next->choice.label() << ": " << ms(q.step_s) << " ms (" << std::showpos << std::fixed
       << std::setprecision(1) << (q.step_s / p.step_s - 1) * 100 << "%" << std::noshowpos << ")";
    if (q.step_s < p.step_s * 1.005)
      os << ", within 0.5%: a tie as far as the model can tell";
    else
      os << ", mostly " << most->first << " (" << std::showpos << ms(most->second) << std::noshowpos << " ms)";
    if (next->host < best.host) os << ", for " << mib(double(best.host - next->host)) << " less host memory per rank";
  }
  return os.str();
}

}  // namespace

std::string report_path(const std::string& out) {
  const std::string ext = ".json";
  if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
    return out.substr(0, out.size() - ext.size()) + ".report.json";
  return out + ".report.json";
}

void rank(std::vector<Candidate*>& fit) {
  std::stable_sort(fit.begin(), fit.end(), [](const Candidate* a, const Candidate* b) {
    return a->pred.step_s != b->pred.step_s ? a->pred.step_s < b->pred.step_s : a->host < b->host;
  });
}

void print_ranking(const PlanRequest& req, const PlanInputs& in, const std::vector<Candidate*>& fit, bool root) {
  const std::string& report = in.report;
  const Candidate& best = *fit[0];
  if (root) {
    std::printf("\n");
    std::vector<const Candidate*> rows(fit.begin(), fit.begin() + std::min<size_t>(fit.size(), size_t(std::max(1, req.show))));
    print_table(rows, false);
    if (fit.size() > rows.size()) std::printf("  ... %zu more that fit (all in %s)\n", fit.size() - rows.size(), report.c_str());
    std::printf("\n%s\n", why(best, fit.size() > 1 ? fit[1] : nullptr).c_str());
  }
}

void write_outputs(const PlanRequest& req, const PlanInputs& in, const std::vector<Candidate>& all,
                   const std::vector<Candidate*>& fit, const std::map<std::string, long>& dropped,
                   const Measurements& measured, const Calibration& cal, int threads, bool root) {
  const int world = in.world, local = in.local;
  const long global = in.global;
  const HostMemory& avail = in.avail;
  const uint64_t nvme_free = in.nvme_free;
  const std::string &out = in.out, &report = in.report;
  const auto& links = measured.links;
  const auto& stage_links = measured.stage_links;
  const auto& micro = measured.micro;
  const double adamw = measured.adamw, disk = measured.disk;
  const Candidate& best = *fit[0];
  if (!root) return;
  nlohmann::json cands = nlohmann::json::array();
  for (const Candidate* c : fit) {
    const StepShape& s = c->shape;
    nlohmann::json j = {{"choice", c->choice.to_json()},
                        {"host_bytes_per_rank", c->host},
                        {"nvme_bytes_per_rank", c->nvme},
                        {"shape",
                         {{"stage", s.stage}, {"world", s.world}, {"grad_accum", s.grad_accum}, {"layers", s.layers},
                          {"recomputed_blocks", s.recomputed_blocks}, {"overlap", s.overlap},
                          {"pipeline", s.pipeline}, {"chunks", s.chunks}, {"tensor", s.tensor},
                          {"stage_blocks", s.stage_blocks}, {"stage_recomputed", s.stage_recomputed},
                          {"tensor_bytes", s.tensor_bytes}, {"tensor_collectives", s.tensor_collectives},
                          {"p2p_bytes", s.p2p_bytes}, {"tie_bytes", s.tie_bytes}, {"tie_pieces", s.tie_pieces}, {"replicas", s.replicas}, {"ranks", s.ranks}, {"ranks_per_host", s.ranks_per_host},
                          {"replica_collectives", s.replica_collectives}, {"replica_bytes", s.replica_bytes},
                          {"padded_params", s.padded_params}, {"units", s.units}, {"buckets", s.buckets},
                          {"shard_params", s.shard_params}, {"comm_bytes", s.comm_bytes}, {"collectives", s.collectives},
                          {"tail_bytes", s.tail_bytes}, {"all_gather_share", s.all_gather_share},
                          {"optimizer_io_bytes", s.optimizer_io_bytes},
                          {"grad_path_bytes", s.grad_path_bytes}}},
                        {"embedding_rows", c->embedding_rows},
                        {"rates",
                         {{"block_s", c->rates.block_s}, {"block_recomputed_s", c->rates.block_recomputed_s},
                          {"fixed_s", c->rates.fixed_s}, {"adamw_s_per_param", c->rates.adamw_s_per_param},
                          {"reduce_alpha_s", c->rates.reduce_alpha_s}, {"reduce_bytes_per_s", c->rates.reduce_bytes_per_s},
                          {"gather_alpha_s", c->rates.gather_alpha_s}, {"gather_bytes_per_s", c->rates.gather_bytes_per_s},
                          {"overlap_exposed", c->rates.overlap_exposed},
                          {"pipeline_s_per_byte", c->rates.pipeline_s_per_byte},
                          {"pass_first_s", c->rates.pass_first_s}, {"pass_next_s", c->rates.pass_next_s},
                          {"pass_flush_s", c->rates.pass_flush_s},
                          {"pass_exposed", c->rates.pass_exposed},
                          {"memory_bytes_per_s", c->rates.memory_bytes_per_s},
                          {"tensor_alpha_s", c->rates.tensor_alpha_s}, {"tensor_bytes_per_s", c->rates.tensor_bytes_per_s},
                          {"p2p_alpha_s", c->rates.p2p_alpha_s}, {"p2p_bytes_per_s", c->rates.p2p_bytes_per_s},
                          {"idle_share", c->rates.idle_share},
                          {"replica_alpha_s", c->rates.replica_alpha_s}, {"replica_bytes_per_s", c->rates.replica_bytes_per_s}}},
                        {"predicted", c->pred.to_json()}};
    if (c->measured_s > 0) {
      j["measured_step_s"] = c->measured_s;
      j["measured_runs_s"] = c->measured_runs_s;
      j["measured_update_runs_s"] = c->measured_update_runs_s;
    }
    if (c->engine_first_micro_s > 0)  // what pass_first_s, pass_next_s and pass_flush_s came from
      j["engine_passes"] = {{"first_micro_s", c->engine_first_micro_s}, {"next_micro_s", c->engine_next_micro_s},
                            {"flush_s", c->engine_flush_s}, {"tail_s", c->engine_base_tail_s},
                            {"base_micro_s", c->engine_base_micro_s}, {"base_compute_s", c->engine_base_compute_s}};
    cands.push_back(j);
  }
  nlohmann::json links_json = nlohmann::json::object();
  for (const auto& [k, l] : links) {
    const auto& [op, size_mb, group] = k;
    links_json[op + (group.empty() ? "" : " " + group) + " bucket_mb " + std::to_string(size_mb)] = {
        {"alpha_s", l.alpha_s}, {"bytes_per_s", l.bytes_per_s}};
  }
  for (const auto& [k, l] : stage_links)
    links_json["stage_link P" + std::to_string(k.first) + " bytes " + std::to_string(k.second)] = {
        {"alpha_s", l.alpha_s}, {"bytes_per_s", l.bytes_per_s}};
  nlohmann::json micro_json = nlohmann::json::object();
  for (const auto& [k, m] : micro) {
    const auto& [b, policy, rows, tp, sp] = k;
    micro_json["B" + std::to_string(b) + " " + policy + " embedding_rows " + std::to_string(rows) +
               (tp > 1 ? " tp" + std::to_string(tp) + (sp ? " sp" : "") : "")] = {{"block_s", m.block_s}, {"fixed_s", m.fixed_s}};
  }
  // What was left out, and why (docs/autoplan.md, "Candidates"): the plan's checks, and memory.
  nlohmann::json left_out = nlohmann::json::object();
  for (const auto& [reason, n] : dropped) left_out[reason] = n;
  long over = 0;
  for (const Candidate& c : all) over += c.fits ? 0 : 1;
  if (over > 0) left_out["over the memory available"] = over;
  const nlohmann::json rep = {
      {"base", req.base},
      {"world", world},
      {"global_batch", global},
      {"available_host_bytes", avail.bytes},
      {"available_nvme_bytes", nvme_free},
      {"ranks_per_host", local},
      {"runtime_overhead_bytes", kRuntimeOverhead},
      {"machine", cal.machine()},
      {"threads_per_rank", threads},
      {"rates", {{"micro_step", micro_json}, {"adamw_s_per_param", adamw}, {"links", links_json}, {"disk_bytes_per_s", disk}}},
      {"probes", cal.used()},
      {"left_out", left_out},
      {"candidates", cands}};
  write_plan_and_report(out, best.resolved, report, rep);
}

}  // namespace zt::autoplan
