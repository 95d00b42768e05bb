// Plan loading, part 1 (docs/design.md §4): read JSON, follow "extends", check keys and value types
// against the schema (= plans/base.json, embedded), merge over the defaults, apply --set overrides.
// Part 2, the typed Plan and its validation, is plan.cpp.
//
//   resolve_plan: parse each file of the "extends" chain (refusing duplicate keys and deep nesting
//   before anything walks the value), check its keys and value types against the schema,
//   deep-merge parent <- child over the defaults, apply overrides (type-checked against the
//   schema too). Each step throws one zt::Error line that names the file and/or JSON path.
#include "plan/plan.h"

#include <glob.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <sstream>
#include <unordered_set>

#include "runtime/error.h"
#include "runtime/output_path.h"
#include "runtime/support.h"
#include "plan/plan_detail.h"

namespace zt {

extern const char* const kBasePlanJson;  // generated from plans/base.json (base_plan.cpp.in)

namespace plan_detail {

namespace fs = std::filesystem;

// A path quoted in a message (a 50 MB "extends" value made a 50 MB error line).
constexpr size_t kPathShown = 240;

// Code points that print as nothing or as a plain space: zero-width and joining marks, direction
// marks and overrides, spaces other than U+0020, the byte order mark.
bool invisible(uint32_t c) {
  return c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == 0xa0 || c == 0xad || c == 0x34f || c == 0x61c ||
         c == 0x115f || c == 0x1160 || c == 0x17b4 || c == 0x17b5 || (c >= 0x180b && c <= 0x180f) ||
         (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x206f) ||
         c == 0x3000 || c == 0x3164 || (c >= 0xfe00 && c <= 0xfe0f) || c == 0xfeff || c == 0xffa0 ||
         (c >= 0xfff0 && c <= 0xfffb) || (c >= 0xe0000 && c <= 0xe0fff);
}

// `s` with what cannot be seen written as \uXXXX (bytes that are not UTF-8 as \xNN): a key with a
// zero-width space was reported as unknown key "optim.lr", which reads exactly as the right one.
std::string escape_invisible(const std::string& s) {
  std::string out;
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t c = len == 1 ? b : len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char t = static_cast<unsigned char>(s[i + k]);
      ok = (t & 0xc0) == 0x80;
      c = (c << 6) | (t & 0x3f);
    }
    if (!ok) {
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
      ++i;
      continue;
    }
    if (invisible(c)) {
      std::snprintf(buf, sizeof buf, c > 0xffff ? "\\U%08x" : "\\u%04x", unsigned(c));
      out += buf;
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  return out;
}

// `s` without its invisible code points: the key that was meant.
std::string strip_invisible(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    uint32_t c = len == 1 ? b : len == 2 ? b & 0x1f : len == 3 ? b & 0x0f : b & 0x07;
    for (size_t k = 1; k < len && i + k < s.size(); ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    if (!invisible(c)) out.append(s, i, std::min(len, s.size() - i));
    i += len;
  }
  return out;
}

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// A value as JSON text for a message, clipped (invalid UTF-8 from --set text is replaced, not thrown).
std::string shown(const json& v, size_t max) {
  return clip(v.dump(-1, ' ', false, json::error_handler_t::replace), max);
}

// "string \"8\"", "number 2.5", "integer 3", "boolean true", "null", "array [1,2]", "object".
std::string describe(const json& v) {
  if (v.is_string()) return "string " + shown(v);
  if (v.is_number_integer()) return "integer " + v.dump();
  if (v.is_number()) return "number " + v.dump();
  if (v.is_boolean()) return std::string("boolean ") + (v.get<bool>() ? "true" : "false");
  if (v.is_null()) return "null";
  if (v.is_array()) return "array " + shown(v, 40);
  return "object";
}

// What the schema value `s` demands, phrased for "expected ...".
std::string expected_type(const json& s) {
  if (s.is_object()) return "an object";
  if (s.is_array()) return "an array of " + std::to_string(s.size()) + " numbers";
  if (s.is_number_integer()) return "an integer";
  if (s.is_number()) return "a number";
  if (s.is_boolean()) return "true or false";
  if (s.is_string()) return "a string";
  return "null";
}

// Leaf type check (objects are walked by the caller). An integer default demands an integer,
// a floating default accepts any number; arrays (optim.betas) must have the schema's length and
// hold numbers.
bool type_matches(const json& s, const json& v) {
  if (s.is_array()) {
    if (!v.is_array() || v.size() != s.size()) return false;
    for (const auto& e : v)
      if (!e.is_number()) return false;
    return true;
  }
  if (s.is_number_integer()) return v.is_number_integer();
  if (s.is_number()) return v.is_number();
  if (s.is_boolean()) return v.is_boolean();
  if (s.is_string()) return v.is_string();
  if (s.is_object()) return v.is_object();
  return false;
}

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Close match by case-insensitive edit distance only (see suggest_key for the full rule).
std::string closest_by_edits(const std::string& bad_key, const std::vector<std::string>& candidates) {
  const std::string b = lower(bad_key);
  const size_t limit = b.size() <= 3 ? 1 : (b.size() <= 6 ? 2 : 3);
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = levenshtein(b, lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= limit ? best : "";
}

// A candidate containing `bad_key` or contained in it ("micro_batch_size" -> "micro_batch").
std::string closest_by_containment(const std::string& bad_key, const std::vector<std::string>& candidates) {
  const std::string b = lower(bad_key);
  if (b.size() < 3) return "";
  for (const auto& c : candidates) {
    std::string lc = lower(c);
    if (lc.size() >= 3 && (lc.find(b) != std::string::npos || b.find(lc) != std::string::npos)) return c;
  }
  return "";
}

std::string key_list(const json& section) {
  std::string out;
  for (auto it = section.begin(); it != section.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out;
}

// The message for key `key` not found in schema section `section` (at dotted `section_path`).
std::string unknown_key_message(const json& section, const std::string& section_path, const std::string& key) {
  const std::string full = join_key(section_path, key);
  std::string msg = "unknown key \"" + clip(full) + "\"";
  std::vector<std::string> here;
  for (auto it = section.begin(); it != section.end(); ++it) here.push_back(it.key());
  const std::string seen = strip_invisible(key);
  if (seen != key && std::find(here.begin(), here.end(), seen) != here.end())
    return msg + " (did you mean \"" + join_key(section_path, seen) + "\"? the key holds characters that cannot be seen)";

  // Preference: a near-miss spelling here, the exact name in another section, a name here that
  // contains it (or that it contains), then (top level only) a near-miss name in any section.
  std::string guess = closest_by_edits(key, here);
  if (!guess.empty()) return msg + " (did you mean \"" + join_key(section_path, guess) + "\"?)";

  // The same name in another section ("lr" at the top level, or "model.lr", means "optim.lr").
  const json& base = base_plan_json();
  std::vector<std::string> leaves;  // "sec.leaf" for every leaf of every section
  for (auto sec = base.begin(); sec != base.end(); ++sec) {
    if (!sec->is_object()) continue;
    for (auto it = sec->begin(); it != sec->end(); ++it) {
      if (it.key() == key && sec.key() != section_path) return msg + " (did you mean \"" + sec.key() + "." + key + "\"?)";
      leaves.push_back(sec.key() + "." + it.key());
    }
  }
  guess = closest_by_containment(key, here);
  if (!guess.empty()) return msg + " (did you mean \"" + join_key(section_path, guess) + "\"?)";
  if (section_path.empty()) {  // a misspelled leaf written at the top level: "stag" -> "zero.stage"
    std::vector<std::string> names;
    for (const auto& l : leaves) names.push_back(l.substr(l.find('.') + 1));
    std::string g = suggest_key(key, names);
    if (!g.empty())
      for (const auto& l : leaves)
        if (l.substr(l.find('.') + 1) == g) return msg + " (did you mean \"" + l + "\"?)";
    return msg + " (allowed top-level keys: " + key_list(section) + ")";
  }
  return msg + " (allowed keys in \"" + section_path + "\": " + key_list(section) + ")";
}

// JSON null means "unset": the default, and only where the default is "" (a path that is off unless
// given: model.init, checkpoint.dir, run.final_weights, run.trace). Elsewhere it has no meaning
// (--set checkpoint.dir=null once became a directory named "null"), so it is refused.
bool unsettable(const json& s) { return s.is_string() && s.get_ref<const std::string&>().empty(); }

std::string null_refused(const json& s) {
  return "null (unset) is accepted only by keys that are off by default (\"\"); give " + expected_type(s) +
         " (the default is " + shown(s) + ")";
}

// Replaces every null leaf of `v` (checked by check_schema) with its default from schema `s`.
void unset_nulls(const json& s, json& v) {
  if (v.is_null()) {
    v = s;
    return;
  }
  if (!v.is_object() || !s.is_object()) return;
  for (auto it = v.begin(); it != v.end(); ++it) {
    auto sit = s.find(it.key());
    if (sit != s.end()) unset_nulls(*sit, *it);
  }
}

// Walks `v` against schema `s`; the first unknown key or wrong type throws
// "plan: <msg><where>" (where = "" or " (in FILE)").
void check_schema(const json& s, const json& v, const std::string& path, const std::string& where) {
  if (s.is_object()) {
    if (!v.is_object()) {
      if (path.empty()) throw Error("plan: expected a JSON object at the top level, got " + describe(v) + where);
      throw Error("plan: " + path + ": expected an object (a section), got " + describe(v) + where);
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      auto sit = s.find(it.key());
      if (sit == s.end()) throw Error("plan: " + unknown_key_message(s, path, it.key()) + where);
      check_schema(*sit, *it, join_key(path, it.key()), where);
    }
    return;
  }
  if (v.is_null() && !path.empty()) {
    if (unsettable(s)) return;
    throw Error("plan: " + path + ": " + null_refused(s) + where);
  }
  if (!type_matches(s, v))
    throw Error("plan: " + path + ": expected " + expected_type(s) + ", got " + describe(v) + where);
}

// Objects merge key by key, recursively; any other value replaces.
void deep_merge(json& dst, const json& src) {
  for (auto it = src.begin(); it != src.end(); ++it) {
    auto dit = dst.find(it.key());
    if (dit != dst.end() && dit->is_object() && it->is_object())
      deep_merge(*dit, *it);
    else
      dst[it.key()] = *it;
  }
}

std::string read_file_or_throw(const std::string& path, const std::string& extended_by) {
  std::string suffix = extended_by.empty() ? "" : " (extended by " + clip(extended_by, kPathShown) + ")";
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error("plan " + clip(path, kPathShown) + ": cannot open: is a directory" + suffix);
  // Before the open: a FIFO would block it until some writer came.
  const std::string problem = input_file_problem(path);
  if (!problem.empty()) throw Error("plan " + clip(path, kPathShown) + " " + problem + suffix);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("plan " + clip(path, kPathShown) + ": cannot open: " + std::strerror(errno) + suffix);
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) throw Error("plan " + clip(path, kPathShown) + ": read failed" + suffix);
  return text;
}

// What a plain parse would hide or what recursion over the parsed value would not survive.
struct ShapeProblem {
  enum Kind { none, too_deep, duplicate_key, number_range } kind = none;
  std::string path;  // of the duplicated key or the number: "optim.lr", "optim.betas[1].a"
  std::string text;  // number_range: the number as written ("1e400")
};

// A SAX pass over the text that builds nothing: nlohmann keeps the last of two equal keys
// silently, and its printing and comparison recurse once per level of nesting. It stops at the
// first problem (or syntax error, which the parse that follows reports with its position).
class ShapeScan : public nlohmann::json_sax<json> {
 public:
  ShapeProblem problem;

  bool null() override { return element_done(); }
  bool boolean(bool) override { return element_done(); }
  bool number_integer(number_integer_t) override { return element_done(); }
  bool number_unsigned(number_unsigned_t) override { return element_done(); }
  bool number_float(number_float_t, const string_t&) override { return element_done(); }
  bool string(string_t&) override { return element_done(); }
  bool binary(binary_t&) override { return element_done(); }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    f.key = k;
    if (f.keys.insert(k).second) return true;
    problem = {ShapeProblem::duplicate_key, join_key(f.path, k), ""};
    return false;
  }
  // A number past a double (1e400) is a parse error to nlohmann, an out_of_range exception that named
  // no file or key; the key is known here.
  bool parse_error(std::size_t, const std::string& token, const nlohmann::detail::exception& e) override {
    if (e.id == 406) {
      std::string path;
      if (!stack_.empty()) {
        const Frame& f = stack_.back();
        path = f.array ? f.path + "[" + std::to_string(f.index) + "]" : join_key(f.path, f.key);
      }
      problem = {ShapeProblem::number_range, path, token};
    }
    return false;
  }

 private:
  struct Frame {
    bool array;
    std::string path;
    std::string key;                      // objects: the key whose value comes next
    std::unordered_set<std::string> keys;  // objects: keys seen so far
    size_t index = 0;                     // arrays: the element that comes next
  };
  std::vector<Frame> stack_;

  bool open(bool array) {
    if (stack_.size() >= size_t(kMaxJsonDepth)) {
      problem = {ShapeProblem::too_deep, "", ""};
      return false;
    }
    std::string path;
    if (!stack_.empty()) {
      const Frame& f = stack_.back();
      path = f.array ? f.path + "[" + std::to_string(f.index) + "]" : join_key(f.path, f.key);
    }
    stack_.push_back(Frame{array, std::move(path), "", {}, 0});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return element_done();
  }
  bool element_done() {
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    return true;
  }
};

ShapeProblem scan_shape(const std::string& text) {
  ShapeScan scan;
  json::sax_parse(text, &scan);
  return scan.problem;
}

json parse_or_throw(const std::string& text, const std::string& path) {
  const ShapeProblem sp = scan_shape(text);
  if (sp.kind == ShapeProblem::too_deep)
    throw Error("plan " + clip(path, kPathShown) + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                " levels (a plan nests 3 levels at most)");
  if (sp.kind == ShapeProblem::duplicate_key)
    throw Error("plan " + clip(path, kPathShown) + ": duplicate key \"" + clip(sp.path) + "\" (a key may appear only once in an object)");
  if (sp.kind == ShapeProblem::number_range)
    throw Error("plan " + clip(path, kPathShown) + ": " + (sp.path.empty() ? "" : "\"" + clip(sp.path) + "\": ") +
                clip(sp.text, 40) + " is out of the range of a number (a double: about 1.8e308 at most)");
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line L, column C: MSG"
    std::string what = e.what();
    std::smatch m;
    static const std::regex re("at line ([0-9]+), column ([0-9]+): (.*)");
    if (std::regex_search(what, m, re))
      throw Error("plan " + clip(path, kPathShown) + ": malformed JSON at line " + m[1].str() + ", column " + m[2].str() + ": " + m[3].str());
    // Fallback: compute line/column from the byte offset.
    size_t upto = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i < upto; ++i) {
      if (text[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    size_t p = what.find("] ");
    throw Error("plan " + clip(path, kPathShown) + ": malformed JSON at line " + std::to_string(line) + ", column " + std::to_string(col) +
                ": " + (p == std::string::npos ? what : what.substr(p + 2)));
  }
}

// Resolves one file of the chain: its parent (if any) merged under its own keys. `chain` holds
// the canonical paths of the files naming this one (for cycle detection), `shown` their paths
// as written.
json resolve_file(const std::string& path, const std::string& extended_by, std::vector<std::string>& chain,
                  std::vector<std::string>& shown, std::vector<std::string>* files) {
  std::error_code ec;
  std::string canon = fs::weakly_canonical(fs::path(path), ec).string();
  if (ec) canon = fs::path(path).lexically_normal().string();
  for (size_t i = 0; i < chain.size(); ++i) {
    if (chain[i] == canon) {
      std::string cyc;
      for (size_t k = i; k < shown.size(); ++k) cyc += clip(shown[k], kPathShown) + " -> ";
      throw Error("plan " + clip(shown.front(), kPathShown) + ": \"extends\" cycle: " + cyc + clip(path, kPathShown));
    }
  }
  if (files) files->push_back(path);
  json own = parse_or_throw(read_file_or_throw(path, extended_by), path);
  const std::string where = " (in " + clip(path, kPathShown) + ")";
  if (!own.is_object()) throw Error("plan " + clip(path, kPathShown) + ": expected a JSON object at the top level, got " + describe(own));

  json merged = json::object();
  auto ext = own.find("extends");
  if (ext != own.end()) {
    if (!ext->is_string() || ext->get<std::string>().empty())
      throw Error("plan " + clip(path, kPathShown) + ": \"extends\": expected a non-empty string (a plan path relative to this file), got " +
                  describe(*ext));
    fs::path target(ext->get<std::string>());
    if (target.is_relative()) target = fs::path(path).parent_path() / target;
    std::string tpath = target.lexically_normal().string();
    if (target.filename() == "base.json" && !fs::exists(target, ec)) {  // ec: a name too long is not found
      // Extending "base.json" where none sits beside the plan: the embedded defaults, which
      // underlie every plan anyway.
    } else {
      chain.push_back(canon);
      shown.push_back(path);
      merged = resolve_file(tpath, path, chain, shown, files);
      chain.pop_back();
      shown.pop_back();
    }
    own.erase("extends");
  }
  check_schema(base_plan_json(), own, "", where);
  unset_nulls(base_plan_json(), own);
  deep_merge(merged, own);
  return merged;
}

}  // namespace plan_detail

using namespace plan_detail;

std::string clip(const std::string& raw, size_t max) {
  const std::string s = escape_invisible(raw.size() > 4 * max ? raw.substr(0, 4 * max) : raw);
  if (s.size() <= max && raw.size() <= 4 * max) return s;
  size_t n = std::min(s.size(), max > 3 ? max - 3 : 0);
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a UTF-8 sequence
  return s.substr(0, n) + "...";
}

std::string suggest_key(const std::string& bad_key, const std::vector<std::string>& candidates) {
  std::string s = closest_by_edits(bad_key, candidates);
  return s.empty() ? closest_by_containment(bad_key, candidates) : s;
}

const nlohmann::json& base_plan_json() {
  static const json base = json::parse(kBasePlanJson);
  return base;
}

nlohmann::json resolve_plan(const std::string& path, const std::vector<std::string>& overrides,
                            std::vector<std::string>* files) {
  std::vector<std::string> chain, shown;
  json resolved = base_plan_json();
  deep_merge(resolved, resolve_file(path, "", chain, shown, files));

  const json& schema = base_plan_json();
  for (const std::string& ov : overrides) {
    const std::string pre = "--set " + clip(ov) + ": ";
    size_t eq = ov.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(pre + "expected KEY=VALUE with a dotted key, e.g. --set zero.stage=2");
    const std::string key = ov.substr(0, eq), text = ov.substr(eq + 1);

    // Walk the schema and the resolved plan together along the dotted key.
    const json* s = &schema;
    json* target = &resolved;
    std::string section;
    size_t start = 0;
    while (true) {
      size_t dot = key.find('.', start);
      std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (!s->is_object()) throw Error(pre + "\"" + section + "\" is a value, not a section");
      auto sit = s->find(part);
      if (part.empty() || sit == s->end()) throw Error(pre + unknown_key_message(*s, section, part));
      s = &*sit;
      target = &(*target)[part];
      section = join_key(section, part);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (s->is_object())
      throw Error(pre + "\"" + key + "\" is a section; set one of its keys (" + key_list(*s) + "), e.g. --set " + key +
                  "." + s->begin().key() + "=...");

    // The value: JSON when it parses (numbers, true/false, arrays, "quoted strings"), else the raw
    // text as a string. A string field takes the raw text even when it would parse (run.log=2024),
    // so nesting and duplicate keys matter only for the others.
    json value = text;
    const ShapeProblem sp = scan_shape(text);
    if (!s->is_string() && sp.kind == ShapeProblem::too_deep)
      throw Error(pre + "value nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (!s->is_string() && sp.kind == ShapeProblem::duplicate_key)
      throw Error(pre + "duplicate key \"" + clip(sp.path) + "\" in the value");
    if (!s->is_string() && sp.kind == ShapeProblem::number_range)
      throw Error(pre + clip(sp.text, 40) + " is out of the range of a number (a double: about 1.8e308 at most)");
    if (sp.kind == ShapeProblem::none) {
      try {
        json parsed = json::parse(text);
        if (!s->is_string() || parsed.is_string() || parsed.is_null()) value = std::move(parsed);
      } catch (const json::parse_error&) {
      }
    }
    if (value.is_null()) {  // as in a plan file; a path named "null" is --set 'KEY="null"'
      if (!unsettable(*s)) throw Error(pre + null_refused(*s));
      value = *s;
    }
    if (!type_matches(*s, value)) throw Error(pre + "expected " + expected_type(*s) + ", got " + describe(value));
    *target = value;
  }
  return resolved;
}

}  // namespace zt
