#include "zero/data_mesh.h"

#include <sstream>

#include "runtime/error.h"

namespace zt {

DataMesh DataMesh::of(const Plan& plan, int world, int rank, int ranks_per_host) {
  const std::string& g = plan.zero.shard_group;
  DataMesh m;
  const int P = plan.mesh.pipeline;
  ZT_REQUIRE(P >= 1 && world % P == 0, "mesh.pipeline " << P << " does not divide the world of " << world
                                                        << " ranks: every stage holds world / mesh.pipeline ranks (run "
                                                        << "a multiple of " << P << " ranks, or set mesh.pipeline 1)");
  m.pipeline = P;
  m.stage = rank / (world / P);
  rank %= world / P;  // the place in the stage, over which the axes below are laid out
  world /= P;
  const int T = plan.mesh.tensor;
  ZT_REQUIRE(T >= 1 && world % T == 0, "mesh.tensor " << T << " does not divide the " << (P > 1 ? "stage" : "world")
                                                       << " of " << world << " ranks: the data axis is "
                                                       << (P > 1 ? "world / (mesh.pipeline x mesh.tensor)" : "world / mesh.tensor")
                                                       << " ranks (run a multiple of " << P * T
                                                       << " ranks, or set mesh.tensor 1)");
  m.tensor = T;
  m.tensor_rank = rank % T;
  m.world = world / T;
  m.rank = rank / T;
  world = m.world;
  int s = world;
  if (g == "host") {
    ZT_REQUIRE(ranks_per_host > 0, "zero.shard_group \"host\": the number of ranks per host is not known here "
                                   "(train estimate: give --ranks-per-host K)");
    ZT_REQUIRE(ranks_per_host % T == 0, "zero.shard_group \"host\": " << ranks_per_host << " ranks per host hold no "
                                                                       << "whole tensor groups of mesh.tensor " << T);
    s = ranks_per_host / T;
  } else if (g != "world") {
    s = std::stoi(g);  // digits, checked by the plan
  }
  ZT_REQUIRE(s >= 1 && s <= world && world % s == 0,
             "zero.shard_group: " << (g == "host" ? "\"host\" (" + std::to_string(s) + " ranks per host)" : g)
                                  << (T > 1 ? " does not divide the data axis of " : " does not divide the world of ") << world
                                  << " ranks: every shard group needs as many ranks (give a divisor of " << world
                                  << ", or \"world\")");
  m.shard = s;
  m.replicas = world / s;
  if (m.hybrid()) {
    ZT_REQUIRE(plan.zero.stage >= 1, "zero.shard_group " << g << " (" << m.replicas << " replicated groups of " << s
                                                        << ") needs zero.stage 1, 2 or 3: stage 0 shards nothing "
                                                           "(set zero.shard_group \"world\")");
    ZT_REQUIRE(plan.offload.params == "none",
               "zero.shard_group " << g << " with offload.params \"" << plan.offload.params
                                   << "\" is not supported: the replicas sum their gradient shards in memory "
                                      "(set offload.params \"none\", or zero.shard_group \"world\")");
  }
  return m;
}

std::string describe_mesh(const DataMesh& m) {
  std::ostringstream os;
  if (!m.hybrid())
    os << "one shard group of " << m.world << (m.world == 1 ? " rank" : " ranks");
  else
    os << m.replicas << " shard groups of " << m.shard << (m.shard == 1 ? " rank" : " ranks")
       << ", each a replica (shard all-reduce across groups)";
  return os.str();
}

}  // namespace zt
