// A gtest fixture with a fresh directory per test, removed afterwards (test_data, test_outputs).
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(const char* prefix = "zt_test") : prefix_(prefix) {}
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix_ + "_XXXXXX")).string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string prefix_;
  std::filesystem::path dir_;
};
