// Internal to the config reader (config.cc, config_read.cc): the schema of
// the file, the helpers for messages, and the Loader that reads a parsed
// TOML table into a Config and checks it, remembering where each value was
// written so every error can name FILE:LINE:COL. Not for other users.
#pragma once

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "common/fs.h"
#include "supervisor/config.h"

namespace wsup::config_detail {

// ---------------------------------------------------------------------------
// The schema: every section and key the file may contain. Reading code below
// must agree with it; the unknown-key check and the suggestions come from it.

struct SectionSpec {
  std::string_view name;
  std::vector<std::string_view> keys;
  bool required;
  std::string_view example;  // shown when the section is missing
};

inline const std::vector<SectionSpec>& Schema() {
  static const std::vector<SectionSpec> schema = {
      {"node", {"name", "state_dir", "runtime_dir"}, true,
       "[node] name = \"node1\", state_dir = \"/var/lib/wsup\", runtime_dir = \"/run/wsup\""},
      {"model", {"path", "revision"}, true, "[model] path = \"/models/my-model\""},
      {"parallel", {"tp", "devices", "expert_parallel"}, false, ""},
      {"weight_cache", {"mode", "backend", "socket", "layout", "layout_max_bytes"}, false, ""},
      {"engine",
       {"command", "host", "primary_port", "standby_port", "ready_timeout_ms", "stop_timeout_ms", "env"},
       true,
       "[engine] command = [\"wsup-engine\", \"--port\", \"{port}\"], primary_port = 8001, "
       "standby_port = 8002"},
      {"probe",
       {"kind", "prompt", "expect", "expect_token_ids", "max_tokens", "interval_ms", "timeout_ms", "failures",
        "successes", "jitter_ms", "comm", "comm_max_age_ms"},
       true, "[probe] prompt = \"Hello\", expect = \"...\""},
      {"front", {"listen", "queue_timeout_ms", "max_queued", "hedge_after_ms", "hedge_percent", "hedge_burst", "loops"}, true, "[front] listen = \"127.0.0.1:8000\""},
      {"admin", {"listen"}, true, "[admin] listen = \"127.0.0.1:9090\""},
      {"supervisor",
       {"restart_backoff_ms", "restart_backoff_max_ms", "max_restarts", "restart_window_ms", "rollout_watch_ms",
        "control_socket", "log_level"},
       false, ""},
      {"holder", {"binary", "command", "ready_timeout_ms"}, false, ""},
      {"kv", {"pool_mib", "scratch_mib"}, false, ""},
      {"group", {"name", "index", "size", "head", "etcd", "lease_ttl_ms"}, false, ""},
  };
  return schema;
}

inline const SectionSpec* FindSection(std::string_view name) {
  for (const auto& s : Schema())
    if (s.name == name) return &s;
  return nullptr;
}

inline constexpr int64_t kMaxMs = 7LL * 24 * 3600 * 1000;  // a week: larger is a typo
// front.hedge_percent above this would send most requests of a slow but
// healthy active to the standby too (config_read.cc says why).
inline constexpr int kMaxHedgePercent = 50;
inline constexpr int64_t kMaxLayoutBytes = 1LL << 50;      // 1 PiB of layouts per holder: larger is a typo
inline constexpr int64_t kMaxKvPoolMib = 1LL << 24;        // 16 TiB per rank, the most a holder makes
inline constexpr int64_t kMaxKvScratchMib = 1LL << 20;     // 1 TiB: larger is a typo
inline constexpr int64_t kMaxGroupSize = 256;                // nodes in one group
// etcd grants leases in whole seconds; past ten minutes a partitioned
// member would serve far too long.
inline constexpr int64_t kMinLeaseTtlMs = 1000, kMaxLeaseTtlMs = 600'000;

// ---------------------------------------------------------------------------
// Small helpers for messages.

inline size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                                          std::tolower(static_cast<unsigned char>(b[j - 1]))
                                      ? 0
                                      : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest candidate, or "" when none is close enough to be a typo.
inline std::string Closest(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto c : candidates) {
    size_t d = EditDistance(word, c);
    if (d < best_d) {
      best_d = d;
      best = std::string(c);
    }
  }
  size_t limit = std::max<size_t>(2, word.size() / 3);
  // A substring ("timeout" in "timeout_ms") is a likely slip too.
  if (best_d <= limit) return best;
  for (auto c : candidates)
    if (word.size() >= 3 && (c.find(word) != std::string_view::npos || word.find(c) != std::string_view::npos))
      return std::string(c);
  return "";
}

inline std::string JoinQuoted(const std::vector<std::string_view>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  return out;
}

// A user's string made safe to echo in a one-line message: control bytes
// escaped, long values cut.
inline std::string Printable(std::string_view v, size_t max = 60) {
  std::string out;
  for (char c : v) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

inline std::string TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

// A short rendering of a value for messages: strings quoted, long ones cut.
inline std::string Show(const toml::node& n) {
  if (auto* s = n.as_string()) return '"' + Printable(s->get(), 40) + '"';
  if (auto* i = n.as_integer()) return std::to_string(i->get());
  if (auto* b = n.as_boolean()) return b->get() ? "true" : "false";
  if (auto* f = n.as_floating_point()) {
    std::ostringstream os;
    os << f->get();
    return os.str();
  }
  if (n.is_table()) return "{...}";
  if (n.is_array()) return "[...]";
  return TypeName(n);
}

inline std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

inline bool IsBareKeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

inline std::string ResolvePath(const std::string& dir, const std::string& p) {
  if (p.empty()) return p;
  std::filesystem::path path(p);
  if (!path.is_absolute()) path = std::filesystem::path(dir) / path;
  std::string out = path.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// Finds the placeholders ("{name}", name of [a-z_]) in one argument.
inline std::vector<std::string> PlaceholdersIn(const std::string& arg) {
  std::vector<std::string> names;
  for (size_t i = 0; i < arg.size(); ++i) {
    if (arg[i] != '{') continue;
    size_t j = i + 1;
    while (j < arg.size() && (std::islower(static_cast<unsigned char>(arg[j])) || arg[j] == '_')) ++j;
    if (j < arg.size() && arg[j] == '}' && j > i + 1) {
      names.push_back(arg.substr(i + 1, j - i - 1));
      i = j;
    }
  }
  return names;
}

// ---------------------------------------------------------------------------

struct Origin {  // where a --set override came from
  int index;
  int key_col;
  int value_col;
};

struct Location {
  std::string file;
  int line;
  int col;
};

class Loader {
 public:
  Loader(std::string file, std::string dir) : file_(std::move(file)), dir_(std::move(dir)) {}

  Status ApplyOverride(toml::table& root, int index, const std::string& text);
  Status CheckUnknown(const toml::table& root);
  Status Read(const toml::table& root, Config* c);
  Status CheckRules(Config* c);
  // The node's Unix socket paths fit in sun_path (part of CheckRules).
  Status CheckSocketPaths(const Config& c) const;
  // [group]: index and head among the members, etcd endpoints, lease.
  Status CheckGroup(const Config& c) const;
  // A name made of letters, digits, '.', '_' and '-' (`use` says why).
  Status PlainName(const std::string& key, const std::string& value, const std::string& use) const;
  // Fills c->where for every key of the schema.
  void RecordWhere(Config* c) const {
    for (const SectionSpec& s : Schema()) {
      for (std::string_view k : s.keys) {
        const std::string key = std::string(s.name) + "." + std::string(k);
        Location l = Where(key);
        c->where[key] = l.file + ":" + std::to_string(std::max(1, l.line)) + ":" + std::to_string(std::max(1, l.col));
      }
    }
  }

 private:
  Error ErrAt(const Location& loc, const std::string& key, const std::string& what) const {
    return InvalidArgument(loc.file + ":" + std::to_string(std::max(1, loc.line)) + ":" +
                           std::to_string(std::max(1, loc.col)) + ": " + key + ": " + what);
  }
  Location FileLoc(const toml::source_region& r) const {
    return {file_, static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)};
  }
  // Where the value of `key` was written: its --set, its node, its section, or the file's top.
  Location Where(const std::string& key) const {
    if (auto it = set_.find(key); it != set_.end()) return {"--set", it->second.index, it->second.value_col};
    if (auto it = value_src_.find(key); it != value_src_.end()) return FileLoc(it->second);
    std::string section = key.substr(0, key.find('.'));
    if (auto it = set_.find(section); it != set_.end()) return {"--set", it->second.index, it->second.key_col};
    if (auto it = section_src_.find(section); it != section_src_.end()) return FileLoc(it->second);
    return {file_, 1, 1};
  }
  Error Err(const std::string& key, const std::string& what) const { return ErrAt(Where(key), key, what); }

  const toml::table* Section(const toml::table& root, std::string_view name) {
    const toml::node* n = root.get(name);
    if (!n) return nullptr;
    section_src_[std::string(name)] = n->source();
    return n->as_table();  // non-tables were refused by CheckUnknown
  }
  const toml::node* Get(const toml::table* sec, std::string_view section, std::string_view key) {
    if (!sec) return nullptr;
    const toml::node* n = sec->get(key);
    if (n) value_src_[std::string(section) + "." + std::string(key)] = n->source();
    return n;
  }
  Error Missing(const std::string& key, const std::string& example) const {
    std::string section = key.substr(0, key.find('.'));
    return Err(key, "missing; this key is required in [" + section + "], e.g. " + example);
  }
  Error WrongType(const std::string& key, const toml::node& n, const std::string& want) const {
    std::string hint;
    if (const auto* str = n.as_string()) {
      // "3" or "true" in quotes: the value is right, the quotes are not.
      const std::string& v = str->get();
      bool digits = !v.empty() && std::all_of(v.begin(), v.end(), [](char ch) {
        return std::isdigit(static_cast<unsigned char>(ch)) || ch == '-';
      });
      if ((want.find("integer") != std::string::npos && digits) ||
          (want.find("boolean") != std::string::npos && (v == "true" || v == "false")))
        hint = "; write it without quotes";
    }
    return Err(key, "expected " + want + ", got " + TypeName(n) + " (" + Show(n) + ")" + hint);
  }

  Status Str(const toml::table* sec, std::string_view section, std::string_view key, std::string* out,
             bool required, const std::string& example = "") {
    std::string k = std::string(section) + "." + std::string(key);
    const toml::node* n = Get(sec, section, key);
    if (!n) return required ? Status(Missing(k, example)) : Status::Ok();
    if (!n->is_string()) return WrongType(k, *n, "a string");
    *out = n->as_string()->get();
    if (required && out->empty()) return Err(k, "is empty; give a value, e.g. " + example);
    return Status::Ok();
  }
  Status Int(const toml::table* sec, std::string_view section, std::string_view key, int64_t* out, int64_t lo,
             int64_t hi, bool required = false, const std::string& example = "") {
    std::string k = std::string(section) + "." + std::string(key);
    const toml::node* n = Get(sec, section, key);
    if (!n) return required ? Status(Missing(k, example)) : Status::Ok();
    std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    if (!n->is_integer()) return WrongType(k, *n, range);
    int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) return Err(k, std::to_string(v) + " is out of range; allowed: " + range);
    *out = v;
    return Status::Ok();
  }
  Status Int(const toml::table* sec, std::string_view section, std::string_view key, int* out, int64_t lo,
             int64_t hi, bool required = false, const std::string& example = "") {
    int64_t v = *out;
    WSUP_RETURN_IF_ERROR(Int(sec, section, key, &v, lo, hi, required, example));
    *out = static_cast<int>(v);
    return Status::Ok();
  }
  Status Bool(const toml::table* sec, std::string_view section, std::string_view key, bool* out) {
    std::string k = std::string(section) + "." + std::string(key);
    const toml::node* n = Get(sec, section, key);
    if (!n) return Status::Ok();
    if (!n->is_boolean()) return WrongType(k, *n, "a boolean (true or false)");
    *out = n->as_boolean()->get();
    return Status::Ok();
  }
  Status Choice(const toml::table* sec, std::string_view section, std::string_view key,
                const std::vector<std::string_view>& allowed, std::string* out) {
    std::string k = std::string(section) + "." + std::string(key);
    WSUP_RETURN_IF_ERROR(Str(sec, section, key, out, false));
    if (std::find(allowed.begin(), allowed.end(), *out) != allowed.end()) return Status::Ok();
    std::string guess = Closest(*out, allowed);
    return Err(k, "\"" + Printable(*out) + "\" is not allowed; allowed: " + JoinQuoted(allowed) +
                      (guess.empty() ? "" : " (did you mean " + guess + "?)"));
  }
  Status StrArray(const toml::table* sec, std::string_view section, std::string_view key,
                  std::vector<std::string>* out, bool required, const std::string& example = "") {
    std::string k = std::string(section) + "." + std::string(key);
    const toml::node* n = Get(sec, section, key);
    if (!n) return required ? Status(Missing(k, example)) : Status::Ok();
    const toml::array* a = n->as_array();
    if (!a) return WrongType(k, *n, "an array of strings");
    out->clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      if (!e.is_string())
        return ErrAt(set_.count(k) ? Where(k) : FileLoc(e.source()), k,
                     "element " + std::to_string(i + 1) + " is " + TypeName(e) + " (" + Show(e) +
                         "); every element must be a string: quote it");
      out->push_back(e.as_string()->get());
    }
    return Status::Ok();
  }
  Status IntArray(const toml::table* sec, std::string_view section, std::string_view key,
                  std::vector<int64_t>* out, int64_t lo, int64_t hi, bool* present) {
    std::string k = std::string(section) + "." + std::string(key);
    const toml::node* n = Get(sec, section, key);
    *present = n != nullptr;
    if (!n) return Status::Ok();
    const toml::array* a = n->as_array();
    if (!a) return WrongType(k, *n, "an array of integers");
    out->clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = *a->get(i);
      Location loc = set_.count(k) ? Where(k) : FileLoc(e.source());
      if (!e.is_integer())
        return ErrAt(loc, k,
                     "element " + std::to_string(i + 1) + " is " + TypeName(e) + " (" + Show(e) +
                         "); every element must be an integer from " + std::to_string(lo) + " to " +
                         std::to_string(hi));
      int64_t v = e.as_integer()->get();
      if (v < lo || v > hi)
        return ErrAt(loc, k,
                     "element " + std::to_string(i + 1) + " (" + std::to_string(v) + ") is out of range; allowed: " +
                         std::to_string(lo) + " to " + std::to_string(hi));
      out->push_back(v);
    }
    return Status::Ok();
  }
  Status Listen(const toml::table* sec, std::string_view section, ListenAddress* out, const std::string& example) {
    std::string k = std::string(section) + ".listen";
    std::string text;
    WSUP_RETURN_IF_ERROR(Str(sec, section, "listen", &text, true, "listen = \"" + example + "\""));
    auto addr = ParseListenAddress(text);
    if (!addr.ok()) return Err(k, Printable(addr.error().message(), 400));
    *out = *addr;
    return Status::Ok();
  }
  Status Command(const std::string& key, const std::vector<std::string>& argv,
                 const std::vector<std::string>& allowed, bool need_port) {
    if (argv.empty() || argv[0].empty())
      return Err(key, "is empty; give the program and its arguments, e.g. [\"wsup-engine\", \"--port\", \"{port}\"]");
    bool has_port = false;
    for (const auto& arg : argv) {
      for (const auto& name : PlaceholdersIn(arg)) {
        if (name == "port") has_port = true;
        if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
          std::vector<std::string_view> views(allowed.begin(), allowed.end());
          std::string guess = Closest(name, views);
          std::string list;
          for (const auto& a : allowed) list += (list.empty() ? "{" : ", {") + a + "}";
          return Err(key, "unknown placeholder {" + name + "} in \"" + Printable(arg) + "\"; allowed: " + list +
                              (guess.empty() ? "" : " (did you mean {" + guess + "}?)"));
        }
      }
    }
    if (need_port && !has_port)
      return Err(key, "has no {port} placeholder; the supervisor runs two engines on different ports, so the "
                      "command must pass {port} to the engine, e.g. \"--port\", \"{port}\"");
    return Status::Ok();
  }

  std::string file_;
  std::string dir_;
  std::map<std::string, Origin> set_;
  std::map<std::string, toml::source_region> value_src_;
  std::map<std::string, toml::source_region> section_src_;
};


}  // namespace wsup::config_detail
