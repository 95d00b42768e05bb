// Helpers shared by the parts of plan loading (plan_json.cpp: parse, schema, merge; plan.cpp: typed
// reads and validation; plan_pipeline.cpp: the pipeline axis's checks). Internal to src/plan.
#pragma once
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace zt::plan_detail {

using json = nlohmann::json;

// A value as JSON text for a message, clipped (invalid UTF-8 from --set text is replaced, not thrown).
std::string shown(const json& v, size_t max = 60);
// "string \"8\"", "number 2.5", "integer 3", "boolean true", "null", "array [1,2]", "object".
std::string describe(const json& v);
// Walks `v` against schema `s`; the first unknown key or wrong type throws
// "plan: <msg><where>" (where = "" or " (in FILE)").
void check_schema(const json& s, const json& v, const std::string& path, const std::string& where);
// Replaces every null leaf of `v` (accepted by check_schema: keys whose default is "") with its
// default from schema `s`.
void unset_nulls(const json& s, json& v);
// Objects merge key by key, recursively; any other value replaces.
void deep_merge(json& dst, const json& src);

// Throws zt::Error "plan: <path>: <what>".
[[noreturn]] void bad(const std::string& path, const std::string& what);
// The pipeline axis (mesh.pipeline, schedule, chunks) against the rest of the plan (plan_pipeline.cpp).
void check_pipeline(const Plan& p);

}  // namespace zt::plan_detail
