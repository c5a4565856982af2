#include "supervisor/config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "common/fs.h"

namespace wsup {
namespace {

// ---------------------------------------------------------------------------
// The schema: every section and key the file may contain. Reading code below
// must agree with it; the unknown-key check and the suggestions come from it.

struct SectionSpec {
  std::string_view name;
  std::vector<std::string_view> keys;
  bool required;
  std::string_view example;  // shown when the section is missing
};

const std::vector<SectionSpec>& Schema() {
  static const std::vector<SectionSpec> schema = {
      {"node", {"name", "state_dir", "runtime_dir"}, true,
       "[node] name = \"node1\", state_dir = \"/var/lib/wsup\", runtime_dir = \"/run/wsup\""},
      {"model", {"path", "revision"}, true, "[model] path = \"/models/my-model\""},
      {"parallel", {"tp", "devices"}, false, ""},
      {"weight_cache", {"mode", "backend", "socket"}, false, ""},
      {"engine",
       {"command", "host", "primary_port", "standby_port", "ready_timeout_ms", "stop_timeout_ms", "env"},
       true,
       "[engine] command = [\"wsup-engine\", \"--port\", \"{port}\"], primary_port = 8001, "
       "standby_port = 8002"},
      {"probe",
       {"kind", "prompt", "expect", "expect_token_ids", "max_tokens", "interval_ms", "timeout_ms", "failures",
        "successes", "jitter_ms", "comm", "comm_max_age_ms"},
       true, "[probe] prompt = \"Hello\", expect = \"...\""},
      {"front", {"listen", "queue_timeout_ms", "max_queued"}, true, "[front] listen = \"127.0.0.1:8000\""},
      {"admin", {"listen"}, true, "[admin] listen = \"127.0.0.1:9090\""},
      {"supervisor",
       {"restart_backoff_ms", "restart_backoff_max_ms", "max_restarts", "restart_window_ms", "control_socket",
        "log_level"},
       false, ""},
      {"holder", {"binary", "command", "ready_timeout_ms"}, false, ""},
  };
  return schema;
}

const SectionSpec* FindSection(std::string_view name) {
  for (const auto& s : Schema())
    if (s.name == name) return &s;
  return nullptr;
}

constexpr int64_t kMaxMs = 7LL * 24 * 3600 * 1000;  // a week: larger is a typo

// ---------------------------------------------------------------------------
// Small helpers for messages.

size_t EditDistance(std::string_view a, std::string_view b) {
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
std::string Closest(std::string_view word, const std::vector<std::string_view>& candidates) {
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

std::string JoinQuoted(const std::vector<std::string_view>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  return out;
}

// A user's string made safe to echo in a one-line message: control bytes
// escaped, long values cut.
std::string Printable(std::string_view v, size_t max = 60) {
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

std::string TypeName(const toml::node& n) {
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
std::string Show(const toml::node& n) {
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

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool IsBareKeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

std::string ResolvePath(const std::string& dir, const std::string& p) {
  if (p.empty()) return p;
  std::filesystem::path path(p);
  if (!path.is_absolute()) path = std::filesystem::path(dir) / path;
  std::string out = path.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// Finds the placeholders ("{name}", name of [a-z_]) in one argument.
std::vector<std::string> PlaceholdersIn(const std::string& arg) {
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
  // Fills c->where for the keys later checks name.
  void RecordWhere(Config* c) const {
    for (const char* key : {"model.path", "engine.command", "holder.binary", "holder.command", "node.state_dir",
                            "node.runtime_dir"}) {
      Location l = Where(key);
      c->where[key] = l.file + ":" + std::to_string(std::max(1, l.line)) + ":" + std::to_string(std::max(1, l.col));
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

Status Loader::ApplyOverride(toml::table& root, int index, const std::string& text) {
  auto fail = [&](int col, const std::string& key, const std::string& what) {
    return Status(ErrAt({"--set", index, col}, key, what));
  };
  size_t eq = text.find('=');
  if (eq == std::string::npos)
    return fail(1, text.empty() ? "--set" : text,
                "has no '='; write --set section.key=value, e.g. --set probe.failures=5");
  std::string key = Trim(std::string_view(text).substr(0, eq));
  std::string value = Trim(std::string_view(text).substr(eq + 1));
  int value_col = static_cast<int>(eq) + 2;
  while (value_col <= static_cast<int>(text.size()) && std::isspace(static_cast<unsigned char>(text[value_col - 1])))
    ++value_col;
  std::vector<std::string> parts;
  {
    size_t start = 0;
    for (;;) {
      size_t dot = key.find('.', start);
      parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  }
  if (key.empty()) return fail(1, "--set", "no key before '='; write --set section.key=value");
  for (const auto& p : parts) {
    if (p.empty() || !std::all_of(p.begin(), p.end(), IsBareKeyChar))
      return fail(1, key, "is not a dotted key of letters, digits, '_' and '-'; write --set section.key=value");
  }
  if (parts.size() < 2) {
    const SectionSpec* owner = nullptr;
    for (const auto& s : Schema())
      if (std::find(s.keys.begin(), s.keys.end(), key) != s.keys.end()) owner = &s;
    return fail(1, key,
                "names no section; write --set section.key=value" +
                    (owner ? " (did you mean " + std::string(owner->name) + "." + key + "?)" : std::string()));
  }
  if (value.empty()) return fail(value_col, key, "has no value after '='; write --set " + key + "=VALUE");

  // The value as TOML ("5", "true", "[\"a\"]", "\"text\""), else as a string.
  toml::table parsed;
  bool as_toml = false;
  try {
    parsed = toml::parse(std::string_view("v = " + value), std::string_view("--set"));
    as_toml = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error&) {
    as_toml = false;
  }

  toml::table* tbl = &root;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path += (i ? "." : "") + parts[i];
    toml::node* n = tbl->get(parts[i]);
    if (!n) {
      tbl->insert(parts[i], toml::table{});
      n = tbl->get(parts[i]);
      set_[path] = {index, 1, value_col};
    }
    if (!n->is_table())
      return fail(1, key, path + " is " + TypeName(*n) + ", not a section or table, so it has no key " + parts[i + 1]);
    tbl = n->as_table();
  }
  if (as_toml) {
    tbl->insert_or_assign(parts.back(), std::move(*parsed.get("v")));
  } else {
    tbl->insert_or_assign(parts.back(), value);
  }
  set_[key] = {index, 1, value_col};
  return Status::Ok();
}

Status Loader::CheckUnknown(const toml::table& root) {
  struct Found {
    bool from_set;
    Location loc;
    std::string key;
    std::string what;
  };
  std::vector<Found> found;
  auto add = [&](const std::string& key, const toml::key& k, const std::string& what) {
    auto it = set_.find(key);
    if (it != set_.end())
      found.push_back({true, {"--set", it->second.index, it->second.key_col}, key, what});
    else
      found.push_back({false, FileLoc(k.source()), key, what});
  };
  std::vector<std::string_view> section_names;
  for (const auto& s : Schema()) section_names.push_back(s.name);

  for (auto&& [k, v] : root) {
    std::string name(k.str());
    const SectionSpec* spec = FindSection(name);
    if (!spec) {
      const SectionSpec* owner = nullptr;
      for (const auto& s : Schema())
        if (std::find(s.keys.begin(), s.keys.end(), name) != s.keys.end()) owner = &s;
      if (!v.is_table() && owner) {
        add(name, k, "keys must be inside a section (did you mean " + std::string(owner->name) + "." + name +
                         ", written under [" + std::string(owner->name) + "]?)");
        continue;
      }
      std::string guess = Closest(name, section_names);
      add(name, k,
          "unknown section" + (guess.empty() ? "" : " (did you mean [" + guess + "]?)") +
              "; allowed sections: " + JoinQuoted(section_names));
      continue;
    }
    if (!v.is_table()) {
      add(name, k,
          "expected a section [" + name + "], got " + TypeName(v) +
              (v.is_array() ? " (write [" + name + "], not [[" + name + "]])" : ""));
      continue;
    }
    for (auto&& [k2, v2] : *v.as_table()) {
      std::string key2(k2.str());
      std::string full = name + "." + key2;
      if (std::find(spec->keys.begin(), spec->keys.end(), key2) != spec->keys.end()) continue;
      std::string guess = Closest(key2, spec->keys);
      add(full, k2,
          "unknown key" + (guess.empty() ? "" : " (did you mean " + guess + "?)") + "; allowed keys in [" +
              name + "]: " + JoinQuoted(spec->keys));
    }
  }
  if (found.empty()) return Status::Ok();
  // Report the first in reading order: the file top to bottom, then --set in order.
  auto first = std::min_element(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.from_set, a.loc.line, a.loc.col) < std::tie(b.from_set, b.loc.line, b.loc.col);
  });
  return ErrAt(first->loc, first->key, first->what);
}

Status Loader::Read(const toml::table& root, Config* c) {
  for (const auto& s : Schema()) {
    if (!s.required || root.get(s.name)) continue;
    return ErrAt({file_, 1, 1}, std::string(s.name),
                 "missing required section [" + std::string(s.name) + "]; add it, e.g. " + std::string(s.example));
  }

  // [node]
  const toml::table* node = Section(root, "node");
  WSUP_RETURN_IF_ERROR(Str(node, "node", "name", &c->node.name, true, "name = \"node1\""));
  WSUP_RETURN_IF_ERROR(Str(node, "node", "state_dir", &c->node.state_dir, true, "state_dir = \"/var/lib/wsup\""));
  WSUP_RETURN_IF_ERROR(Str(node, "node", "runtime_dir", &c->node.runtime_dir, true, "runtime_dir = \"/run/wsup\""));
  for (char ch : c->node.name)
    if (!IsBareKeyChar(ch) && ch != '.')
      return Err("node.name", "\"" + Printable(c->node.name) +
                                  "\" has a character other than letters, digits, '.', '_' and '-'; it is used in "
                                  "file names and metrics labels, so pick a plain name");
  c->node.state_dir = ResolvePath(dir_, c->node.state_dir);
  c->node.runtime_dir = ResolvePath(dir_, c->node.runtime_dir);

  // [model]
  const toml::table* model = Section(root, "model");
  WSUP_RETURN_IF_ERROR(Str(model, "model", "path", &c->model.path, true, "path = \"/models/my-model\""));
  WSUP_RETURN_IF_ERROR(Str(model, "model", "revision", &c->model.revision, false));
  c->model.path = ResolvePath(dir_, c->model.path);

  // [parallel]
  const toml::table* par = Section(root, "parallel");
  WSUP_RETURN_IF_ERROR(Int(par, "parallel", "tp", &c->parallel.tp, 1, 1024));
  {
    std::vector<int64_t> devs;
    bool present = false;
    WSUP_RETURN_IF_ERROR(IntArray(par, "parallel", "devices", &devs, 0, 1023, &present));
    c->parallel.devices.assign(devs.begin(), devs.end());
  }

  // [weight_cache]
  const toml::table* wc = Section(root, "weight_cache");
  {
    std::string mode = "daemon", backend = "host";
    WSUP_RETURN_IF_ERROR(Choice(wc, "weight_cache", "mode", {"daemon", "client", "off"}, &mode));
    WSUP_RETURN_IF_ERROR(Choice(wc, "weight_cache", "backend", {"host", "cuda"}, &backend));
    c->weight_cache.mode = mode == "daemon" ? CacheMode::kDaemon : mode == "client" ? CacheMode::kClient : CacheMode::kOff;
    c->weight_cache.backend = backend == "cuda" ? CacheBackend::kCuda : CacheBackend::kHost;
    std::string socket;
    WSUP_RETURN_IF_ERROR(Str(wc, "weight_cache", "socket", &socket, false));
    if (socket.empty() && value_src_.count("weight_cache.socket"))
      return Err("weight_cache.socket", "is empty; give a socket path or leave the key out for <runtime_dir>/holder.sock");
    c->weight_cache.socket = socket.empty() ? c->node.runtime_dir + "/holder.sock" : ResolvePath(dir_, socket);
  }

  // [engine]
  const toml::table* eng = Section(root, "engine");
  WSUP_RETURN_IF_ERROR(StrArray(eng, "engine", "command", &c->engine.command, true,
                                "command = [\"wsup-engine\", \"--port\", \"{port}\"]"));
  WSUP_RETURN_IF_ERROR(Command("engine.command", c->engine.command, EnginePlaceholders(), true));
  if (c->engine.command[0].find('/') != std::string::npos)
    c->engine.command[0] = ResolvePath(dir_, c->engine.command[0]);
  WSUP_RETURN_IF_ERROR(Str(eng, "engine", "host", &c->engine.host, false));
  {
    auto addr = ParseListenAddress(c->engine.host + ":1");
    if (c->engine.host.empty() || c->engine.host.front() == '[' || !addr.ok())
      return Err("engine.host", "\"" + Printable(c->engine.host) +
                                    "\" is not an IP address or host name; write e.g. \"127.0.0.1\" or \"::1\" "
                                    "(no brackets, no port)");
  }
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "primary_port", &c->engine.primary_port, 0, 65535, true, "primary_port = 8001"));
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "standby_port", &c->engine.standby_port, 0, 65535, true, "standby_port = 8002"));
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "ready_timeout_ms", &c->engine.ready_timeout_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "stop_timeout_ms", &c->engine.stop_timeout_ms, 0, kMaxMs));
  if (const toml::node* env = Get(eng, "engine", "env")) {
    const toml::table* t = env->as_table();
    if (!t) return WrongType("engine.env", *env, "a table of NAME = \"value\" (e.g. env = { NCCL_DEBUG = \"WARN\" })");
    for (auto&& [k, v] : *t) {
      std::string name(k.str());
      std::string full = "engine.env." + name;
      Location loc = set_.count(full) ? Where(full) : FileLoc(k.source());
      bool ok_name = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                     std::all_of(name.begin(), name.end(), [](char ch) {
                       return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
                     });
      if (!ok_name)
        return ErrAt(loc, full, "is not an environment variable name; use letters, digits and '_', not starting with a digit");
      if (!v.is_string())
        return ErrAt(set_.count(full) ? loc : FileLoc(v.source()), full,
                     "expected a string, got " + TypeName(v) + " (" + Show(v) + "); environment values are strings: quote it");
      c->engine.env.emplace_back(name, v.as_string()->get());
    }
    std::sort(c->engine.env.begin(), c->engine.env.end());
  }

  // [probe]
  const toml::table* probe = Section(root, "probe");
  {
    std::string kind = "semantic";
    WSUP_RETURN_IF_ERROR(Choice(probe, "probe", "kind", {"semantic", "port"}, &kind));
    c->probe.kind = kind == "port" ? ProbeKind::kPort : ProbeKind::kSemantic;
  }
  WSUP_RETURN_IF_ERROR(Str(probe, "probe", "prompt", &c->probe.prompt, false));
  if (Get(probe, "probe", "expect")) {
    std::string expect;
    WSUP_RETURN_IF_ERROR(Str(probe, "probe", "expect", &expect, false));
    c->probe.expect = expect;
  }
  {
    std::vector<int64_t> ids;
    bool present = false;
    WSUP_RETURN_IF_ERROR(IntArray(probe, "probe", "expect_token_ids", &ids, 0, INT32_MAX, &present));
    if (present) c->probe.expect_token_ids = ids;
  }
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "max_tokens", &c->probe.max_tokens, 1, 4096));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "interval_ms", &c->probe.interval_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "timeout_ms", &c->probe.timeout_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "failures", &c->probe.failures, 1, 1000));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "successes", &c->probe.successes, 1, 1000));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "jitter_ms", &c->probe.jitter_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Bool(probe, "probe", "comm", &c->probe.comm));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "comm_max_age_ms", &c->probe.comm_max_age_ms, 1, kMaxMs));

  // [front], [admin]
  const toml::table* front = Section(root, "front");
  WSUP_RETURN_IF_ERROR(Listen(front, "front", &c->front.listen, "127.0.0.1:8000"));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "queue_timeout_ms", &c->front.queue_timeout_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "max_queued", &c->front.max_queued, 0, 1'000'000));
  const toml::table* admin = Section(root, "admin");
  WSUP_RETURN_IF_ERROR(Listen(admin, "admin", &c->admin.listen, "127.0.0.1:9090"));

  // [supervisor]
  const toml::table* sup = Section(root, "supervisor");
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "restart_backoff_ms", &c->supervisor.restart_backoff_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(
      Int(sup, "supervisor", "restart_backoff_max_ms", &c->supervisor.restart_backoff_max_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "max_restarts", &c->supervisor.max_restarts, 0, 1'000'000));
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "restart_window_ms", &c->supervisor.restart_window_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Str(sup, "supervisor", "control_socket", &c->supervisor.control_socket, false));
  c->supervisor.control_socket = c->supervisor.control_socket.empty()
                                     ? c->node.runtime_dir + "/wsup.sock"
                                     : ResolvePath(dir_, c->supervisor.control_socket);
  WSUP_RETURN_IF_ERROR(
      Choice(sup, "supervisor", "log_level", {"trace", "debug", "info", "warn", "error"}, &c->supervisor.log_level));

  // [holder]
  const toml::table* holder = Section(root, "holder");
  WSUP_RETURN_IF_ERROR(Str(holder, "holder", "binary", &c->holder.binary, false));
  c->holder.binary = ResolvePath(dir_, c->holder.binary);
  WSUP_RETURN_IF_ERROR(StrArray(holder, "holder", "command", &c->holder.command, false));
  if (Get(holder, "holder", "command")) {
    WSUP_RETURN_IF_ERROR(Command("holder.command", c->holder.command, HolderPlaceholders(), false));
    if (c->holder.command[0].find('/') != std::string::npos)
      c->holder.command[0] = ResolvePath(dir_, c->holder.command[0]);
  }
  WSUP_RETURN_IF_ERROR(Int(holder, "holder", "ready_timeout_ms", &c->holder.ready_timeout_ms, 1, kMaxMs));
  return Status::Ok();
}

Status Loader::CheckRules(Config* c) {
  // parallel
  const auto& devs = c->parallel.devices;
  std::set<int> seen;
  for (int d : devs)
    if (!seen.insert(d).second)
      return Err("parallel.devices", "device " + std::to_string(d) + " is listed twice; give each rank its own device");
  if (c->weight_cache.backend == CacheBackend::kCuda && static_cast<int>(devs.size()) != c->parallel.tp)
    return Err("parallel.devices",
               "lists " + std::to_string(devs.size()) + " device(s) but parallel.tp is " +
                   std::to_string(c->parallel.tp) + "; the cuda backend needs exactly one device per rank, e.g. devices = [" +
                   [&] {
                     std::string s;
                     for (int i = 0; i < c->parallel.tp && i < 8; ++i) s += (i ? ", " : "") + std::to_string(i);
                     return s + (c->parallel.tp > 8 ? ", ..." : "");
                   }() +
                   "]");
  if (c->weight_cache.backend == CacheBackend::kHost && !devs.empty() && static_cast<int>(devs.size()) != c->parallel.tp)
    return Err("parallel.devices", "lists " + std::to_string(devs.size()) + " device(s) but parallel.tp is " +
                                       std::to_string(c->parallel.tp) +
                                       "; give one device per rank, or leave devices out for the host backend");

  // engine
  // Port 0: the supervisor picks a free port at each start (tests, ad-hoc runs).
  if (c->engine.primary_port != 0 && c->engine.primary_port == c->engine.standby_port)
    return Err("engine.standby_port", "equals engine.primary_port (" + std::to_string(c->engine.primary_port) +
                                          "); the two engines run at once and need different ports");
  for (const auto* l : {&c->front.listen, &c->admin.listen}) {
    const char* key = l == &c->front.listen ? "front.listen" : "admin.listen";
    for (int port : {c->engine.primary_port, c->engine.standby_port})
      if (port != 0 && l->port == port)
        return Err(key, "uses port " + std::to_string(port) +
                            ", which an engine uses (engine.primary_port / engine.standby_port); pick another port");
  }
  if (c->front.listen.port != 0 && c->front.listen.port == c->admin.listen.port)
    return Err("admin.listen", "uses the same port as front.listen (" + std::to_string(c->front.listen.port) +
                                   "); the front and the admin endpoint need different ports");

  // probe
  auto& p = c->probe;
  if (p.timeout_ms > p.interval_ms)
    return Err("probe.timeout_ms", std::to_string(p.timeout_ms) + " is longer than probe.interval_ms (" +
                                       std::to_string(p.interval_ms) +
                                       "); probes never overlap, so a longer timeout would silently stretch the "
                                       "interval: raise interval_ms or lower timeout_ms to at most interval_ms");
  if (p.jitter_ms > p.interval_ms)
    return Err("probe.jitter_ms", std::to_string(p.jitter_ms) + " is longer than probe.interval_ms (" +
                                      std::to_string(p.interval_ms) + "); allowed: 0 to interval_ms");
  if (p.kind == ProbeKind::kSemantic) {
    if (p.prompt.empty())
      return value_src_.count("probe.prompt") ? Err("probe.prompt", "is empty; the semantic probe needs a prompt with a known answer")
                                              : Missing("probe.prompt", "prompt = \"Hello, world\"");
    if (p.expect && p.expect_token_ids)
      return Err("probe.expect_token_ids",
                 "is set together with probe.expect; give exactly one: expect (the answer's text) or expect_token_ids "
                 "(its token ids)");
    if (!p.expect && !p.expect_token_ids)
      return Err("probe.expect", "missing; the semantic probe needs a known answer: set expect = \"text\" or "
                                 "expect_token_ids = [..] in [probe]");
    if (p.expect && p.expect->empty())
      return Err("probe.expect", "is empty; an empty answer proves nothing: give the expected text");
    if (p.expect_token_ids) {
      if (p.expect_token_ids->empty())
        return Err("probe.expect_token_ids", "is empty; give the token ids of the expected answer");
      if (static_cast<int64_t>(p.expect_token_ids->size()) > p.max_tokens)
        return Err("probe.expect_token_ids",
                   "has " + std::to_string(p.expect_token_ids->size()) + " ids but probe.max_tokens is " +
                       std::to_string(p.max_tokens) + ", so the answer can never match; raise max_tokens to at least " +
                       std::to_string(p.expect_token_ids->size()));
    }
  } else {
    for (const char* k : {"probe.prompt", "probe.expect", "probe.expect_token_ids"})
      if (value_src_.count(k) || set_.count(k))
        return Err(k, "only applies to probe.kind = \"semantic\"; remove it or set kind = \"semantic\"");
  }

  // supervisor
  if (c->supervisor.restart_backoff_max_ms < c->supervisor.restart_backoff_ms)
    return Err("supervisor.restart_backoff_max_ms",
               std::to_string(c->supervisor.restart_backoff_max_ms) + " is below supervisor.restart_backoff_ms (" +
                   std::to_string(c->supervisor.restart_backoff_ms) + "); allowed: at least restart_backoff_ms");

  // holder
  if (!c->holder.binary.empty() && !c->holder.command.empty())
    return Err("holder.command", "is set together with holder.binary; set one: binary (standard arguments) or "
                                 "command (a full command line)");
  if (c->node.state_dir == c->node.runtime_dir)
    return Err("node.runtime_dir", "is the same folder as node.state_dir; runtime files are removed at boot while "
                                   "the ledger must persist: use two folders");
  return Status::Ok();
}

// The key of a TOML syntax error: the key on the line, inside its section.
std::string SyntaxKey(std::string_view text, int line) {
  std::string section;
  std::string key;
  int n = 1;
  size_t pos = 0;
  while (pos <= text.size() && n <= line) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string l = Trim(text.substr(pos, end - pos));
    if (!l.empty() && l[0] == '[') {
      size_t b = l.find_first_not_of("[ \t");
      size_t e = b == std::string::npos ? std::string::npos : l.find_first_of("] \t", b);
      std::string name = b == std::string::npos ? "" : l.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!name.empty() && std::all_of(name.begin(), name.end(), [](char ch) { return IsBareKeyChar(ch) || ch == '.'; }))
        section = name;
      if (n == line) return section.empty() ? "syntax" : section;
    } else if (n == line) {
      size_t e = 0;
      while (e < l.size() && (IsBareKeyChar(l[e]) || l[e] == '.')) ++e;
      if (e > 0 && Trim(std::string_view(l).substr(e)).rfind('=', 0) == 0) key = l.substr(0, e);
      if (key.empty()) return section.empty() ? "syntax" : section;
      return section.empty() ? key : section + "." + key;
    }
    pos = end + 1;
    ++n;
  }
  return section.empty() ? "syntax" : section;
}

}  // namespace

std::string ListenAddress::ToString() const {
  return (ipv6() ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<ListenAddress> ParseListenAddress(std::string_view text) {
  const std::string allowed =
      "; allowed: HOST:PORT with an IPv4 address, a host name or a bracketed IPv6 address, and a port from 0 to "
      "65535, e.g. \"127.0.0.1:8000\" or \"[::1]:8000\"";
  std::string s(text);
  if (s.empty()) return InvalidArgument("is empty" + allowed);
  std::string host, port;
  if (s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos) return InvalidArgument("\"" + s + "\" has '[' without ']'" + allowed);
    host = s.substr(1, close - 1);
    if (close + 1 >= s.size() || s[close + 1] != ':')
      return InvalidArgument("\"" + s + "\" has no :PORT after the address" + allowed);
    port = s.substr(close + 2);
    in6_addr a6{};
    if (host.empty() || ::inet_pton(AF_INET6, host.c_str(), &a6) != 1)
      return InvalidArgument("\"" + host + "\" inside the brackets is not an IPv6 address" + allowed);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) return InvalidArgument("\"" + s + "\" has no :PORT" + allowed);
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return InvalidArgument("\"" + s + "\" looks like an IPv6 address without brackets; write [" + host + "]:" + port);
    if (host.empty()) return InvalidArgument("\"" + s + "\" has no host; write 0.0.0.0:" + port + " for all interfaces" + allowed);
    bool numeric = std::all_of(host.begin(), host.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
    if (numeric) {
      in_addr a4{};
      if (::inet_pton(AF_INET, host.c_str(), &a4) != 1)
        return InvalidArgument("\"" + host + "\" is not an IPv4 address" + allowed);
    } else {
      bool name_ok = host.size() <= 253 && host.front() != '-' && host.front() != '.' &&
                     std::all_of(host.begin(), host.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
                     });
      if (!name_ok) return InvalidArgument("\"" + host + "\" is not an IP address or host name" + allowed);
    }
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return InvalidArgument("port \"" + port + "\" is not a number" + allowed);
  int p = std::stoi(port);
  if (p > 65535) return InvalidArgument("port " + port + " is out of range" + allowed);
  return ListenAddress{host, p};
}

const char* CacheModeName(CacheMode m) {
  switch (m) {
    case CacheMode::kDaemon: return "daemon";
    case CacheMode::kClient: return "client";
    case CacheMode::kOff: return "off";
  }
  return "?";
}

const char* CacheBackendName(CacheBackend b) { return b == CacheBackend::kCuda ? "cuda" : "host"; }
const char* ProbeKindName(ProbeKind k) { return k == ProbeKind::kPort ? "port" : "semantic"; }

const std::vector<std::string>& EnginePlaceholders() {
  static const std::vector<std::string> names = {"port",    "model",    "socket",   "devices",    "mode",
                                                 "backend", "tp",       "revision", "runtime_dir", "nonce",
                                                 "ready_fd"};
  return names;
}

const std::vector<std::string>& HolderPlaceholders() {
  static const std::vector<std::string> names = {"rank",    "device", "socket",   "model",      "mode",
                                                 "backend", "tp",     "revision", "runtime_dir"};
  return names;
}

Result<std::vector<std::string>> ExpandPlaceholders(const std::vector<std::string>& argv,
                                                    const std::map<std::string, std::string>& vars) {
  std::vector<std::string> out;
  out.reserve(argv.size());
  for (const auto& arg : argv) {
    std::string r;
    for (size_t i = 0; i < arg.size(); ++i) {
      if (arg[i] == '{') {
        size_t j = i + 1;
        while (j < arg.size() && (std::islower(static_cast<unsigned char>(arg[j])) || arg[j] == '_')) ++j;
        if (j < arg.size() && arg[j] == '}' && j > i + 1) {
          std::string name = arg.substr(i + 1, j - i - 1);
          auto it = vars.find(name);
          if (it == vars.end()) {
            std::string list;
            for (const auto& [k, v] : vars) list += (list.empty() ? "{" : ", {") + k + "}";
            return InvalidArgument("\"" + arg + "\": unknown placeholder {" + name + "}; known: " + list);
          }
          r += it->second;
          i = j;
          continue;
        }
      }
      r += arg[i];
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string DevicesArg(const Config& config) {
  if (config.parallel.devices.empty()) return "cpu";
  // Appended piece by piece: GCC 12 at -O3 gives a false -Wrestrict error
  // on `const char* + std::string&&`.
  std::string s = "cuda:";
  for (size_t i = 0; i < config.parallel.devices.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(config.parallel.devices[i]);
  }
  return s;
}

std::string HolderSocket(const Config& config, int rank) {
  if (config.parallel.tp <= 1) return config.weight_cache.socket;
  return config.weight_cache.socket + "." + std::to_string(rank);
}

std::string EngineSocketsArg(const Config& config) {
  std::string s;
  for (int r = 0; r < std::max(1, config.parallel.tp); ++r) {
    if (r) s += ',';
    s += HolderSocket(config, r);
  }
  return s;
}

namespace {
std::map<std::string, std::string> CommonVars(const Config& c) {
  return {{"model", c.model.path},
          {"socket", c.weight_cache.socket},
          {"mode", CacheModeName(c.weight_cache.mode)},
          {"backend", CacheBackendName(c.weight_cache.backend)},
          {"tp", std::to_string(c.parallel.tp)},
          {"revision", c.model.revision},
          {"runtime_dir", c.node.runtime_dir}};
}
}  // namespace

bool EngineAnnouncesReady(const Config& config) {
  for (const auto& a : config.engine.command) {
    if (a.find("{ready_fd}") != std::string::npos) return true;
  }
  return false;
}

Result<std::vector<std::string>> EngineArgv(const Config& config, int port, const std::string& nonce, int ready_fd) {
  auto vars = CommonVars(config);
  vars["port"] = std::to_string(port);
  vars["nonce"] = nonce;
  vars["ready_fd"] = std::to_string(ready_fd);
  vars["devices"] = DevicesArg(config);
  vars["socket"] = EngineSocketsArg(config);
  auto r = ExpandPlaceholders(config.engine.command, vars);
  if (!r.ok()) return r.error().With("engine.command");
  return r;
}

Result<std::vector<std::string>> HolderArgv(const Config& config, int rank, const std::string& default_binary) {
  if (rank < 0 || rank >= config.parallel.tp)
    return InvalidArgument("holder rank " + std::to_string(rank) + " is outside 0.." +
                           std::to_string(config.parallel.tp - 1) + " (parallel.tp); this is a bug in the caller");
  auto vars = CommonVars(config);
  vars["rank"] = std::to_string(rank);
  vars["socket"] = HolderSocket(config, rank);
  vars["device"] = config.parallel.devices.empty() ? "cpu" : std::to_string(config.parallel.devices[rank]);
  std::vector<std::string> tmpl = config.holder.command;
  if (tmpl.empty()) {
    tmpl = {config.holder.binary.empty() ? default_binary : config.holder.binary,
            "--model", "{model}", "--socket", "{socket}", "--tp-size", "{tp}", "--tp-rank", "{rank}",
            "--backend", "{backend}", "--deployment", config.node.name};
    if (!config.model.revision.empty()) {
      tmpl.push_back("--revision");
      tmpl.push_back("{revision}");
    }
    // The host backend has no device; the cuda one takes the rank's ordinal.
    if (!config.parallel.devices.empty()) {
      tmpl.push_back("--device");
      tmpl.push_back("{device}");
    }
  }
  auto r = ExpandPlaceholders(tmpl, vars);
  if (!r.ok()) return r.error().With("holder.command");
  return r;
}

Result<Config> ParseConfig(std::string_view text, const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) abs = path;
  abs = abs.lexically_normal();
  Config config;
  config.path = abs.string();
  config.dir = abs.parent_path().string();
  Loader loader(path, config.dir);

  toml::table root;
  try {
    root = toml::parse(text, std::string_view(path));
  } catch (const toml::parse_error& e) {
    int line = static_cast<int>(e.source().begin.line);
    int col = static_cast<int>(e.source().begin.column);
    std::string desc = Printable(e.description(), 300);
    return InvalidArgument(path + ":" + std::to_string(std::max(1, line)) + ":" + std::to_string(std::max(1, col)) +
                           ": " + SyntaxKey(text, line) + ": TOML syntax error: " + desc +
                           "; fix the file at this line and column");
  } catch (const std::exception& e) {
    return InvalidArgument(path + ":1:1: syntax: cannot parse (" + std::string(e.what()) + "); check that it is a TOML file");
  }
  try {
    for (size_t i = 0; i < overrides.size(); ++i)
      WSUP_RETURN_IF_ERROR(loader.ApplyOverride(root, static_cast<int>(i) + 1, overrides[i]));
    WSUP_RETURN_IF_ERROR(loader.CheckUnknown(root));
    WSUP_RETURN_IF_ERROR(loader.Read(root, &config));
    WSUP_RETURN_IF_ERROR(loader.CheckRules(&config));
    loader.RecordWhere(&config);
  } catch (const std::exception& e) {
    // toml++ and the standard library only throw on a bug or exhaustion; keep the form.
    return Internal(path + ":1:1: config: unexpected failure while checking (" + std::string(e.what()) +
                    "); please report it with the config file");
  }
  return config;
}

Result<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  auto text = ReadFile(path, 4 << 20);
  if (!text.ok()) {
    return InvalidArgument(path + ":1:1: file: cannot read the config file (" + text.error().message() +
                           "); check the path and its permissions");
  }
  return ParseConfig(*text, path, overrides);
}

std::string DescribeConfig(const Config& c) {
  std::ostringstream os;
  os << "node " << c.node.name << ": state_dir " << c.node.state_dir << ", runtime_dir " << c.node.runtime_dir << "\n";
  os << "model " << c.model.path << (c.model.revision.empty() ? "" : " (revision " + c.model.revision + ")") << "\n";
  os << "parallel: tp " << c.parallel.tp << ", devices " << DevicesArg(c) << "\n";
  os << "weight cache: mode " << CacheModeName(c.weight_cache.mode) << ", backend "
     << CacheBackendName(c.weight_cache.backend) << ", socket " << c.weight_cache.socket << "\n";
  os << "engines: " << c.engine.host << ":" << c.engine.primary_port << " and " << c.engine.host << ":"
     << c.engine.standby_port << ", ready within " << c.engine.ready_timeout_ms << " ms: " << c.engine.command[0]
     << "\n";
  os << "probe: " << ProbeKindName(c.probe.kind) << " every " << c.probe.interval_ms << " ms (+0.."
     << c.probe.jitter_ms << " jitter), timeout " << c.probe.timeout_ms << " ms, trip after " << c.probe.failures
     << ", recover after " << c.probe.successes << (c.probe.comm ? ", comm check on" : "") << "\n";
  os << "front " << c.front.listen.ToString() << ", admin " << c.admin.listen.ToString() << "\n";
  return os.str();
}

CheckOutcome CheckConfig(const std::string& path, const std::vector<std::string>& overrides, bool check_paths,
                         const std::string& default_holder) {
  auto config = LoadConfig(path, overrides);
  if (!config.ok()) return {1, config.error().message() + "\n"};
  if (check_paths) {
    auto errors = CheckConfigPaths(*config, default_holder);
    if (!errors.empty()) {
      std::string out;
      for (const auto& e : errors) out += e.message() + "\n";
      return {1, out};
    }
  }
  return {0, path + ": ok" + (check_paths ? std::string() : std::string(" (paths not checked: --no-paths)")) + "\n" +
                 DescribeConfig(*config)};
}

}  // namespace wsup
