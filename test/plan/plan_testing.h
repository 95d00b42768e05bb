// What the plan tests share (test/plan/*_test.cpp): a temporary directory for plan files, the
// zt::Error a call throws, the base plan with one field replaced or with --set overrides.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/error.h"

namespace plan_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline const std::string kSrc = ZT_SOURCE_DIR;

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("zt_plan_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

// The zt::Error message thrown by f, or a test failure when nothing (or something else) is thrown.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zt::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected zt::Error, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected zt::Error, nothing was thrown";
  return "";
}

inline std::string plan_error(const json& j) {
  return error_of([&] { zt::plan_from_json(j, false); });
}

// The base plan with one field replaced.
inline json base_with(const std::string& section, const std::string& key, const json& value) {
  json j = zt::base_plan_json();
  if (section.empty())
    j[key] = value;
  else
    j[section][key] = value;
  return j;
}

inline std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * size_t(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// The resolved base plan with overrides, validated without looking for data files.
inline zt::Plan plan_with(const std::vector<std::string>& sets) { return zt::load_plan(kSrc + "/plans/base.json", sets, false); }

}  // namespace plan_test
