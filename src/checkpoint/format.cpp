#include "checkpoint/format.h"

#include <cstdio>

#include "runtime/error.h"

namespace zt::ckpt {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::param: return "param";
    case Kind::master: return "master";
    case Kind::adam_m: return "adam_m";
    case Kind::adam_v: return "adam_v";
    case Kind::count: break;
  }
  ZT_ASSERT(false);
  return "";
}

Kind kind_of(StateId id) {
  switch (id) {
    case StateId::params:
    case StateId::param_shard: return Kind::param;
    case StateId::master: return Kind::master;
    case StateId::adam_m: return Kind::adam_m;
    case StateId::adam_v: return Kind::adam_v;
    default: break;
  }
  fail_at(__FILE__, __LINE__, std::string("internal error: checkpoint: no kind for ") + state_name(id));
}

std::string tensor_path(const std::string& tensor_name) {
  std::string p = tensor_name;
  for (char& c : p)
    if (c == '.') c = '/';
  return p;
}

std::string shard_dataset(Kind k, const std::string& tensor_name, size_t offset) {
  char off[32];
  std::snprintf(off, sizeof off, "%015zu", offset);
  return std::string("/") + kind_name(k) + "/" + tensor_path(tensor_name) + "/" + off;
}

std::string model_path(Kind k, const std::string& tensor_name, bool mixed_precision) {
  const bool weights = mixed_precision ? k == Kind::master : k == Kind::param;
  if (weights) return "/" + tensor_path(tensor_name);
  if (k == Kind::param) return "/bf16/" + tensor_path(tensor_name);
  return std::string("/") + kind_name(k) + "/" + tensor_path(tensor_name);
}

std::string step_dir_name(int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step_%08lld", (long long)step);
  return s;
}

std::string rank_file_name(int rank) {
  char s[32];
  std::snprintf(s, sizeof s, "rank_%05d.h5", rank);
  return s;
}

namespace {
// `name` is prefix + exactly `digits` decimal digits + suffix; the number in `value`.
bool numbered(const std::string& name, const char* prefix, size_t digits, const char* suffix, int64_t& value) {
  const std::string pre(prefix), suf(suffix);
  if (name.size() != pre.size() + digits + suf.size() || name.compare(0, pre.size(), pre) != 0 ||
      name.compare(pre.size() + digits, suf.size(), suf) != 0)
    return false;
  value = 0;
  for (size_t i = pre.size(); i < pre.size() + digits; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
    value = value * 10 + (name[i] - '0');
  }
  return true;
}
}  // namespace

bool is_rank_file_name(const std::string& name, int& rank) {
  int64_t r;
  if (!numbered(name, "rank_", 5, ".h5", r)) return false;
  rank = int(r);
  return true;
}

bool is_step_dir_name(const std::string& name, int64_t& step) { return numbered(name, "step_", 8, "", step); }

std::string describe_shape(const GPTConfig& c) {
  return "n_layer " + std::to_string(c.L) + ", n_head " + std::to_string(c.NH) + ", n_embd " + std::to_string(c.C) +
         ", seq_len " + std::to_string(c.maxT) + ", vocab_size " + std::to_string(c.V);
}

}  // namespace zt::ckpt
