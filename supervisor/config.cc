#include "supervisor/config.h"

#include "supervisor/config_loader.h"

namespace wsup {

using namespace config_detail;

namespace config_detail {

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
  // A value that starts as TOML's strings, arrays and tables do and does not
  // parse is refused: taken as a plain string it would keep its quotes and
  // escapes, and mean something else than was meant (a JSON string's
  // "\ud83d\ude42" is one such: TOML has no surrogate escapes).
  toml::table parsed;
  bool as_toml = false;
  try {
    parsed = toml::parse(std::string_view("v = " + value), std::string_view("--set"));
    as_toml = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error& e) {
    if (value.front() == '"' || value.front() == '\'' || value.front() == '[' || value.front() == '{') {
      // engine.env holds secrets: TOML's words may quote the value.
      const bool secret = key.rfind("engine.env", 0) == 0;
      return fail(value_col, key,
                  "the value is not TOML" + (secret ? std::string() : " (" + std::string(e.description()) + ")") +
                      "; write it as TOML (a \"string\" with the characters themselves or \\uXXXX escapes of "
                      "non-surrogate code points, [arrays], {tables}), or without quotes for plain text");
    }
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

}  // namespace config_detail

namespace {

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

Result<Config> ParseConfig(std::string_view text, const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) abs = path;
  abs = abs.lexically_normal();
  Config config;
  config.path = abs.string();
  config.dir = abs.parent_path().string();
  config.overrides = overrides;
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

}  // namespace wsup
