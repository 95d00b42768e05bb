#include "checkpoint/h5.h"

namespace zt::h5 {

void init() {
  static const bool done = [] {
    // A file whose close failed (a full disk) stays open inside the library, and the library's
    // clean-up at exit then crashes closing it again (HDF5 1.10, H5F__close_cb). Every file is
    // closed, and a failed close reported, by our code: the exit-time clean-up has nothing to do.
    // (Must precede every other HDF5 call; init() is the first at every entry point.)
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

std::string error_text() {
  std::string out;
  // One line: a failed system call's description spans lines ("file write failed: time = ...\n,
  // filename = ..., errno = 28, error message = 'No space left on device', ..."); its error
  // message is the part that says what happened.
  auto one_line = [](std::string s) {
    const std::string key = "error message = '";
    const size_t at = s.find(key);
    if (at != std::string::npos) {
      const size_t end = s.find('\'', at + key.size());
      if (end != std::string::npos) return s.substr(at + key.size(), end - at - key.size());
    }
    for (char& c : s)
      if (c == '\n' || c == '\r') c = ' ';
    return s;
  };
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    auto* s = static_cast<std::string*>(data);
    if (n == 0 && e->desc) *s = e->desc;  // walking upward: entry 0 is the most specific
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &out);
  return one_line(out);
}

void fail(const char* file, int line, const char* call) {
  const std::string detail = error_text();
  fail_at(file, line, std::string("HDF5 call failed: ") + call + (detail.empty() ? "" : ": " + detail));
}

herr_t Id::close() {
  if (id_ < 0) return 0;
  herr_t r = -1;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: r = H5Fclose(id_); break;
    case H5I_GROUP: r = H5Gclose(id_); break;
    case H5I_DATASET: r = H5Dclose(id_); break;
    case H5I_DATASPACE: r = H5Sclose(id_); break;
    case H5I_ATTR: r = H5Aclose(id_); break;
    case H5I_DATATYPE: r = H5Tclose(id_); break;
    case H5I_GENPROP_LST: r = H5Pclose(id_); break;
    default: break;
  }
  id_ = -1;
  return r;
}

void Id::release_quietly() { (void)close(); }

namespace {

Id utf8_string_type() {
  Id t(ZT_CHECK_H5(H5Tcopy(H5T_C_S1)));
  ZT_CHECK_H5(H5Tset_size(t, H5T_VARIABLE));
  ZT_CHECK_H5(H5Tset_cset(t, H5T_CSET_UTF8));
  return t;
}

void write_raw(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* data, hsize_t n, bool scalar) {
  Id space(scalar ? ZT_CHECK_H5(H5Screate(H5S_SCALAR)) : ZT_CHECK_H5(H5Screate_simple(1, &n, nullptr)));
  Id a(ZT_CHECK_H5(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT)));
  ZT_CHECK_H5(H5Awrite(a, mem_type, data));
}

// Opens attribute `name` when it exists and holds `n` elements (n = 0: any count, returned).
Id open_attr(hid_t obj, const char* name, hssize_t* count) {
  if (H5Aexists(obj, name) <= 0) return Id();
  Id a(H5Aopen(obj, name, H5P_DEFAULT));
  if (!a.valid()) return Id();
  Id space(H5Aget_space(a));
  if (!space.valid()) return Id();
  *count = H5Sget_simple_extent_npoints(space);
  return a;
}

template <class X>
bool read_number(hid_t obj, const char* name, hid_t mem_type, X& v) {
  hssize_t n = 0;
  Id a = open_attr(obj, name, &n);
  if (!a.valid() || n != 1) return false;
  Id ft(H5Aget_type(a));
  if (!ft.valid() || H5Tget_class(ft) != H5T_INTEGER) return false;
  return H5Aread(a, mem_type, &v) >= 0;
}

}  // namespace

void write_attr(hid_t obj, const char* name, int64_t v) {
  write_raw(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, 1, true);
}
void write_attr(hid_t obj, const char* name, uint64_t v) {
  write_raw(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, 1, true);
}
void write_attr(hid_t obj, const char* name, const std::string& v) {
  Id t = utf8_string_type();
  const char* p = v.c_str();
  write_raw(obj, name, t, t, &p, 1, true);
}
void write_attr(hid_t obj, const char* name, const std::vector<int64_t>& v) {
  write_raw(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v.data(), hsize_t(v.size()), false);
}

bool read_attr(hid_t obj, const char* name, int64_t& v) { return read_number(obj, name, H5T_NATIVE_INT64, v); }
bool read_attr(hid_t obj, const char* name, uint64_t& v) { return read_number(obj, name, H5T_NATIVE_UINT64, v); }

bool read_attr(hid_t obj, const char* name, std::string& v) {
  hssize_t n = 0;
  Id a = open_attr(obj, name, &n);
  if (!a.valid() || n != 1) return false;
  Id ft(H5Aget_type(a));
  if (!ft.valid() || H5Tget_class(ft) != H5T_STRING || H5Tis_variable_str(ft) <= 0) return false;
  Id t = utf8_string_type();
  char* p = nullptr;
  if (H5Aread(a, t, &p) < 0 || !p) return false;
  v = p;
  H5free_memory(p);
  return true;
}

bool read_attr(hid_t obj, const char* name, std::vector<int64_t>& v) {
  hssize_t n = 0;
  Id a = open_attr(obj, name, &n);
  if (!a.valid() || n < 0) return false;
  Id ft(H5Aget_type(a));
  if (!ft.valid() || H5Tget_class(ft) != H5T_INTEGER) return false;
  v.resize(size_t(n));
  return H5Aread(a, H5T_NATIVE_INT64, v.data()) >= 0;
}

bool path_exists(hid_t loc, const std::string& path) {
  size_t pos = 0;
  while (true) {
    const size_t slash = path.find('/', pos);
    const std::string prefix = path.substr(0, slash);
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

Id create_groups(hid_t loc, const std::string& path) {
  Id lcpl(ZT_CHECK_H5(H5Pcreate(H5P_LINK_CREATE)));
  ZT_CHECK_H5(H5Pset_create_intermediate_group(lcpl, 1));
  if (path_exists(loc, path)) return Id(ZT_CHECK_H5(H5Gopen2(loc, path.c_str(), H5P_DEFAULT)));
  return Id(ZT_CHECK_H5(H5Gcreate2(loc, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT)));
}

}  // namespace zt::h5
