// HDF5's C API, checked (docs/design.md §3.7, §3.8). Every HDF5 call of the checkpoint code goes
// through ZT_CHECK_H5, which names file:line, the call and HDF5's innermost error message: a failing
// call there is our bug or the system's. A checkpoint file that is damaged or not ours is the
// user's problem instead: the reader (reader.cpp) tests those calls itself and says which file and
// dataset, without a source line. HDF5 would print its own error stack to stderr on every failed
// call; init() turns that off, so the only output is our one line.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace zt::h5 {

// Silences HDF5's automatic error printing (idempotent; every entry point calls it).
void init();
// The most specific message on HDF5's current error stack ("" when empty).
std::string error_text();
[[noreturn]] void fail(const char* file, int line, const char* call);

// Owns one HDF5 identifier and closes it with the close call of its type. close() reports a
// failed close (for files that were written: the data reaches the file at close); the destructor
// ignores failures (it may run while an error is already propagating).
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  ~Id() { release_quietly(); }
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      release_quietly();
      id_ = o.id_;
      o.id_ = -1;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  herr_t close();  // < 0 on failure

 private:
  void release_quietly();
  hid_t id_ = -1;
};

// Attributes. Writers are checked (file:line); readers return false when the attribute is missing
// or has another type, so the caller can name the file and dataset.
void write_attr(hid_t obj, const char* name, int64_t v);
void write_attr(hid_t obj, const char* name, uint64_t v);
void write_attr(hid_t obj, const char* name, const std::string& v);
void write_attr(hid_t obj, const char* name, const std::vector<int64_t>& v);
bool read_attr(hid_t obj, const char* name, int64_t& v);
bool read_attr(hid_t obj, const char* name, uint64_t& v);
bool read_attr(hid_t obj, const char* name, std::string& v);
bool read_attr(hid_t obj, const char* name, std::vector<int64_t>& v);

// Whether every group of `path` ("a/b/c", relative to `loc`) exists (H5Lexists needs each parent).
bool path_exists(hid_t loc, const std::string& path);
// The groups of `path`, created where missing; returns the last one.
Id create_groups(hid_t loc, const std::string& path);

}  // namespace zt::h5

// Evaluates an HDF5 call; a negative result (hid_t or herr_t) throws naming file:line and the call.
#define ZT_CHECK_H5(call)                                         \
  ([&]() {                                                        \
    auto zt_h5_r_ = (call);                                       \
    if (zt_h5_r_ < 0) ::zt::h5::fail(__FILE__, __LINE__, #call);  \
    return zt_h5_r_;                                              \
  }())
