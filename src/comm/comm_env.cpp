// The ZT_COMM_* variables: overrides of the communication settings a run was given (the plan's
// comm section, wired in train.cu), for experiments without editing a plan. Parsed strictly: a
// mistyped value must not silently become another setting (INFLIGHT=abc once meant "no limit").
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace zt {
namespace {

// The value as set, shortened for a message (it may be any length).
std::string shown(const char* v) {
  const std::string s(v);
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

bool parse_switch(const char* name, const char* v) {
  ZT_REQUIRE(std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0,
             name << "=" << shown(v) << ": expected 0 (off) or 1 (on)");
  return v[0] == '1';
}

// Digits only (no sign, space, exponent or fraction), at most `max`.
int parse_count(const char* name, const char* v, int max, const char* zero_means) {
  const size_t n = std::strlen(v);
  const bool digits = n <= 9 && std::strspn(v, "0123456789") == n;
  const long x = digits ? std::strtol(v, nullptr, 10) : -1;
  ZT_REQUIRE(x >= 0 && x <= max,
             name << "=" << shown(v) << ": expected an integer from 0 (" << zero_means << ") to " << max);
  return int(x);
}

}  // namespace

const char* comm_collectives_name(CommCollectives c) {
  switch (c) {
    case CommCollectives::ring: return "ring";
    case CommCollectives::mpi: return "mpi";
    case CommCollectives::mpi_blocking: return "mpi_blocking";
  }
  return "?";
}

CommCollectives parse_comm_collectives(const std::string& what, const std::string& value) {
  for (CommCollectives c : {CommCollectives::ring, CommCollectives::mpi, CommCollectives::mpi_blocking})
    if (value == comm_collectives_name(c)) return c;
  ZT_REQUIRE(false, what << ": expected \"ring\", \"mpi\" or \"mpi_blocking\"");
  return CommCollectives::ring;
}

std::vector<CommEnvOverride> apply_comm_env(CommOptions& opts) {
  CommOptions o = opts;  // every variable is checked before anything changes
  std::vector<CommEnvOverride> used;
  auto get = [&](const char* name, const char* field) -> const char* {
    const char* v = std::getenv(name);
    if (!v || !*v) return nullptr;
    used.push_back({name, v, field});
    return v;
  };
  if (const char* v = get("ZT_COMM_THREAD", "thread")) o.thread = parse_switch("ZT_COMM_THREAD", v);
  if (const char* v = get("ZT_COMM_COLLECTIVES", "collectives"))
    o.collectives = parse_comm_collectives("ZT_COMM_COLLECTIVES=" + shown(v), v);
  if (const char* v = get("ZT_COMM_INFLIGHT", "inflight"))
    o.inflight = parse_count("ZT_COMM_INFLIGHT", v, kMaxCommInflight, "no limit");
  if (const char* v = get("ZT_COMM_POLL_US", "poll_us"))
    o.poll_us = parse_count("ZT_COMM_POLL_US", v, kMaxCommPollUs, "yield between polls");
  opts = o;
  return used;
}

}  // namespace zt
