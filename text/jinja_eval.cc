// Rendering a parsed chat template (jinja.h) with Python's and Jinja2's
// semantics where the templates can tell: str() of values, truth, ==
// between numbers, undefined values (empty in output, an error when used),
// a scope per loop iteration, and transformers' tojson (json.dumps with
// ensure_ascii=False, the keys in their order).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <utf8proc.h>

#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/utf8.h"

namespace wsup::text::jinja {

namespace {

using T = Value::T;
using json = nlohmann::ordered_json;

// Bounds on one render: a template is a file from the checkpoint, and a
// bad one must end with an error, not hold a request's thread or its memory.
constexpr size_t kMaxOutput = size_t{64} << 20;
constexpr size_t kMaxString = size_t{16} << 20;  // any one value
constexpr int64_t kMaxRange = 1 << 20;
constexpr int64_t kMaxSteps = 1 << 22;  // statements run and loop turns

Value FromJson(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return Value::None();
    case json::value_t::boolean: return Value::Bool(j.get<bool>());
    case json::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
      Value v;
      v.t = T::kFloat;
      v.f = static_cast<double>(u);
      return v;
    }
    case json::value_t::number_float: {
      Value v;
      v.t = T::kFloat;
      v.f = j.get<double>();
      return v;
    }
    case json::value_t::string: return Value::Str(j.get<std::string>());
    case json::value_t::array: {
      Value v = Value::NewList();
      v.list->reserve(j.size());
      for (const auto& x : j) v.list->push_back(FromJson(x));
      return v;
    }
    case json::value_t::object: {
      Value v = Value::NewDict();
      v.dict->reserve(j.size());
      for (const auto& [k, x] : j.items()) v.dict->emplace_back(k, FromJson(x));
      return v;
    }
    default: return Value::None();
  }
}

// Python's repr() of a float: the shortest digits that read back, fixed
// notation for exponents -4 to 15, else d.ddde+XX.
std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  const int decpt = exp + 1;
  if (decpt > -4 && decpt <= 16) {
    std::string out;
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + out + ebuf;
}

// The code points of s (an ill-formed subpart reads as U+FFFD).
std::vector<uint32_t> CodePoints(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t sub = 1;
    const size_t n = WellFormedAt(s, i, &sub);
    if (n == 0) {
      out.push_back(0xfffd);
      i += sub;
    } else {
      out.push_back(static_cast<uint32_t>(CodePointAt(s, i, n)));
      i += n;
    }
  }
  return out;
}

std::string FromCodePoints(const std::vector<uint32_t>& cps, size_t from = 0, size_t to = SIZE_MAX) {
  std::string out;
  for (size_t i = from; i < cps.size() && i < to; ++i) AppendUtf8(cps[i], &out);
  return out;
}

// Python's str.isspace() for one code point.
bool PySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// str.strip/lstrip/rstrip: `chars` null strips whitespace.
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = CodePoints(s);
  std::vector<uint32_t> set;
  if (chars) set = CodePoints(*chars);
  auto strip = [&](uint32_t c) {
    if (!chars) return PySpace(c);
    for (uint32_t x : set) {
      if (x == c) return true;
    }
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return FromCodePoints(cps, b, e);
}

std::string MapCase(const std::string& s, bool upper) {
  std::string out;
  for (uint32_t c : CodePoints(s)) {
    const auto cp = static_cast<utf8proc_int32_t>(c);
    AppendUtf8(static_cast<uint32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)), &out);
  }
  return out;
}

const char* TypeName(const Value& v) {
  switch (v.t) {
    case T::kUndef: return "undefined";
    case T::kNone: return "NoneType";
    case T::kBool: return "bool";
    case T::kInt: return "int";
    case T::kFloat: return "float";
    case T::kStr: return "str";
    case T::kList: return "list";
    case T::kDict: return "dict";
    case T::kNs: return "Namespace";
  }
  return "?";
}

std::string Repr(const Value& v);

// Python's str().
std::string Str(const Value& v) {
  switch (v.t) {
    case T::kUndef: return "";
    case T::kNone: return "None";
    case T::kBool: return v.b ? "True" : "False";
    case T::kInt: return std::to_string(v.i);
    case T::kFloat: return FloatRepr(v.f);
    case T::kStr: return v.s;
    default: return Repr(v);
  }
}

std::string StrRepr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : CodePoints(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<uint32_t>(q)) {
      out += std::string("\\") + q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      AppendUtf8(c, &out);
    }
  }
  out.push_back(q);
  return out;
}

// A list or dict's repr stops growing past kMaxString (a list may hold
// the same long string a million times); the callers refuse a value that
// long, so a cut one is never used.
std::string Repr(const Value& v) {
  switch (v.t) {
    case T::kStr: return StrRepr(v.s);
    case T::kList: {
      std::string out = "[";
      for (size_t i = 0; i < v.list->size() && out.size() <= kMaxString; ++i) {
        out += (i ? ", " : "") + Repr((*v.list)[i]);
      }
      return out + "]";
    }
    case T::kDict:
    case T::kNs: {
      std::string out = v.t == T::kNs ? "<Namespace {" : "{";
      for (size_t i = 0; i < v.dict->size() && out.size() <= kMaxString; ++i) {
        out += (i ? ", " : "") + StrRepr((*v.dict)[i].first) + ": " + Repr((*v.dict)[i].second);
      }
      return out + (v.t == T::kNs ? "}>" : "}");
    }
    default: return Str(v);
  }
}

// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson.
Status Json(const Value& v, int indent, int level, std::string* out) {
  auto newline = [&](int l) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * static_cast<size_t>(l), ' ');
  };
  switch (v.t) {
    case T::kUndef: return InvalidArgument("tojson of an undefined value");
    case T::kNone: *out += "null"; return Status::Ok();
    case T::kBool: *out += v.b ? "true" : "false"; return Status::Ok();
    case T::kInt: *out += std::to_string(v.i); return Status::Ok();
    case T::kFloat:
      *out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : FloatRepr(v.f);
      return Status::Ok();
    case T::kStr:
      out->push_back('"');
      for (unsigned char c : v.s) {
        switch (c) {
          case '"': *out += "\\\""; break;
          case '\\': *out += "\\\\"; break;
          case '\n': *out += "\\n"; break;
          case '\r': *out += "\\r"; break;
          case '\t': *out += "\\t"; break;
          case '\b': *out += "\\b"; break;
          case '\f': *out += "\\f"; break;
          default:
            if (c < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              *out += buf;
            } else {
              out->push_back(static_cast<char>(c));
            }
        }
      }
      out->push_back('"');
      return Status::Ok();
    case T::kList:
    case T::kDict:
    case T::kNs: {
      const bool list = v.t == T::kList;
      const size_t n = list ? v.list->size() : v.dict->size();
      if (n == 0) {
        *out += list ? "[]" : "{}";
        return Status::Ok();
      }
      out->push_back(list ? '[' : '{');
      for (size_t i = 0; i < n; ++i) {
        if (out->size() > kMaxString) return InvalidArgument("tojson passes 16 MiB");
        if (i) *out += indent < 0 ? ", " : ",";
        newline(level + 1);
        if (list) {
          WSUP_RETURN_IF_ERROR(Json((*v.list)[i], indent, level + 1, out));
          continue;
        }
        WSUP_RETURN_IF_ERROR(Json(Value::Str((*v.dict)[i].first), indent, level + 1, out));
        *out += ": ";
        WSUP_RETURN_IF_ERROR(Json((*v.dict)[i].second, indent, level + 1, out));
      }
      newline(level);
      out->push_back(list ? ']' : '}');
      return Status::Ok();
    }
  }
  return Status::Ok();
}

bool Truthy(const Value& v) {
  switch (v.t) {
    case T::kUndef:
    case T::kNone: return false;
    case T::kBool: return v.b;
    case T::kInt: return v.i != 0;
    case T::kFloat: return v.f != 0;
    case T::kStr: return !v.s.empty();
    case T::kList: return !v.list->empty();
    case T::kDict: return !v.dict->empty();
    case T::kNs: return true;
  }
  return false;
}

bool IsNum(const Value& v) { return v.t == T::kInt || v.t == T::kFloat || v.t == T::kBool; }
double Num(const Value& v) { return v.t == T::kFloat ? v.f : static_cast<double>(v.t == T::kBool ? v.b : v.i); }
int64_t IntOf(const Value& v) { return v.t == T::kBool ? v.b : v.i; }
bool IsIntLike(const Value& v) { return v.t == T::kInt || v.t == T::kBool; }

bool Equal(const Value& a, const Value& b) {
  if (IsNum(a) && IsNum(b)) {
    if (IsIntLike(a) && IsIntLike(b)) return IntOf(a) == IntOf(b);
    return Num(a) == Num(b);
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case T::kUndef:
    case T::kNone: return true;
    case T::kStr: return a.s == b.s;
    case T::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!Equal((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    case T::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : *a.dict) {
        const Value* y = b.Find(k);
        if (!y || !Equal(x, *y)) return false;
      }
      return true;
    default: return a.dict == b.dict;
  }
}

class Renderer {
 public:
  Renderer(const std::string& name, const json& vars) : name_(name) {
    globals_ = FromJson(vars.is_object() ? vars : json::object());
  }

  Result<std::string> Run(const Body& root) {
    scopes_.emplace_back();
    auto flow = RunBody(root);
    if (!flow.ok()) return flow.error();
    return std::move(out_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::vector<std::pair<std::string, Value>>;

  Error Fail(int line, const std::string& what) const {
    return InvalidArgument(name_ + ": line " + std::to_string(line) + ": " + what);
  }

  Value Lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      for (auto it = s->rbegin(); it != s->rend(); ++it) {
        if (it->first == name) return it->second;
      }
    }
    if (const Value* v = globals_.Find(name)) return *v;
    return Value::Undef("'" + name + "' is undefined");
  }
  void Assign(const std::string& name, Value v) {
    for (auto& [k, old] : scopes_.back()) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    scopes_.back().emplace_back(name, std::move(v));
  }

  Result<Flow> RunBody(const Body& body) {
    for (const auto& n : body) {
      WSUP_ASSIGN_OR_RETURN(Flow f, RunNode(*n));
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Result<Flow> RunNode(const Node& n) {
    if (++steps_ > kMaxSteps) return Fail(n.line, "the template runs more than " + std::to_string(kMaxSteps) + " steps");
    switch (n.k) {
      case Node::K::kText: return Emit(n.line, n.text);
      case Node::K::kOutput: {
        WSUP_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        std::string s = Str(v);
        if (s.size() > kMaxString) return Fail(n.line, "a value passes 16 MiB");
        return Emit(n.line, s);
      }
      case Node::K::kIf:
        for (size_t i = 0; i < n.bodies.size(); ++i) {
          bool take = true;
          if (i < n.conds.size() && n.conds[i]) {
            WSUP_ASSIGN_OR_RETURN(Value c, Eval(*n.conds[i]));
            take = Truthy(c);
          }
          if (take) return RunBody(n.bodies[i]);
        }
        return Flow::kNormal;
      case Node::K::kFor: return RunFor(n);
      case Node::K::kSet: {
        WSUP_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        if (n.targets.size() == 1) {
          Assign(n.targets[0], std::move(v));
          return Flow::kNormal;
        }
        Value ns = Lookup(n.targets[0]);
        if (ns.t != T::kNs) {
          return Fail(n.line, "cannot set '" + n.targets[1] + "' on '" + n.targets[0] + "', a " + TypeName(ns) +
                                  ", not a namespace()");
        }
        ns.Put(n.targets[1], std::move(v));
        return Flow::kNormal;
      }
      case Node::K::kBreak: return Flow::kBreak;
      case Node::K::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Result<Flow> Emit(int line, const std::string& s) {
    if (out_.size() + s.size() > kMaxOutput) return Fail(line, "the rendered text passes 64 MiB");
    out_ += s;
    return Flow::kNormal;
  }

  Result<std::vector<Value>> Items(int line, const Value& v) {
    std::vector<Value> items;
    switch (v.t) {
      case T::kUndef: break;
      case T::kList: items = *v.list; break;
      case T::kDict:
        for (const auto& kv : *v.dict) items.push_back(Value::Str(kv.first));
        break;
      case T::kStr:
        for (uint32_t c : CodePoints(v.s)) {
          std::string s;
          AppendUtf8(c, &s);
          items.push_back(Value::Str(std::move(s)));
        }
        break;
      default: return Fail(line, std::string("'") + TypeName(v) + "' object is not iterable");
    }
    return items;
  }

  Result<Flow> RunFor(const Node& n) {
    WSUP_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    WSUP_ASSIGN_OR_RETURN(std::vector<Value> items, Items(n.line, seq));
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++steps_ > kMaxSteps) return Fail(n.line, "the template runs more than " + std::to_string(kMaxSteps) + " steps");
      scopes_.emplace_back();
      const Value& item = items[static_cast<size_t>(i)];
      if (n.targets.size() == 2) {
        if (item.t != T::kList || item.list->size() != 2) {
          scopes_.pop_back();
          return Fail(n.line, "cannot unpack a " + std::string(TypeName(item)) + " into two names");
        }
        Assign(n.targets[0], (*item.list)[0]);
        Assign(n.targets[1], (*item.list)[1]);
      } else {
        Assign(n.targets[0], item);
      }
      Value loop = Value::NewDict();
      loop.Put("index0", Value::Int(i));
      loop.Put("index", Value::Int(i + 1));
      loop.Put("revindex0", Value::Int(len - i - 1));
      loop.Put("revindex", Value::Int(len - i));
      loop.Put("first", Value::Bool(i == 0));
      loop.Put("last", Value::Bool(i == len - 1));
      loop.Put("length", Value::Int(len));
      loop.Put("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undef("there is no previous item"));
      loop.Put("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::Undef("there is no next item"));
      Assign("loop", std::move(loop));
      auto f = RunBody(n.bodies[0]);
      scopes_.pop_back();
      if (!f.ok()) return f.error();
      if (*f == Flow::kBreak) break;
    }
    if (len == 0 && n.bodies.size() > 1) return RunBody(n.bodies[1]);
    return Flow::kNormal;
  }

  Status Defined(int line, const Value& v) const {
    if (v.t == T::kUndef) return Fail(line, v.s.empty() ? "a value is undefined" : v.s);
    return Status::Ok();
  }

  Result<Value> Eval(const Expr& e) {
    switch (e.k) {
      case Expr::K::kLit: return e.lit;
      case Expr::K::kName: return Lookup(e.name);
      case Expr::K::kAttr: {
        WSUP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        WSUP_RETURN_IF_ERROR(Defined(e.line, obj));
        return Member(obj, Value::Str(e.name));
      }
      case Expr::K::kItem: {
        WSUP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        WSUP_RETURN_IF_ERROR(Defined(e.line, obj));
        WSUP_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return Member(obj, key);
      }
      case Expr::K::kSlice: return Slice(e);
      case Expr::K::kCall: return Call(e);
      case Expr::K::kMethod: return Method(e);
      case Expr::K::kFilter: return Filter(e);
      case Expr::K::kTest: {
        WSUP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(Test(e.name, v) != e.negated);
      }
      case Expr::K::kNeg:
      case Expr::K::kPos: {
        WSUP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        WSUP_RETURN_IF_ERROR(Defined(e.line, v));
        if (!IsNum(v)) return Fail(e.line, std::string("bad operand type for unary minus: '") + TypeName(v) + "'");
        if (e.k == Expr::K::kPos) return IsIntLike(v) ? Value::Int(IntOf(v)) : v;
        if (v.t == T::kFloat) {
          v.f = -v.f;
          return v;
        }
        return Value::Int(-IntOf(v));
      }
      case Expr::K::kNot: {
        WSUP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!Truthy(v));
      }
      case Expr::K::kAnd:
      case Expr::K::kOr: {
        WSUP_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (Truthy(l) == (e.k == Expr::K::kOr)) return l;
        return Eval(*e.args[1]);
      }
      case Expr::K::kCond: {
        WSUP_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (Truthy(c)) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undef("the condition of an 'x if c' without else was false");
      }
      case Expr::K::kList: {
        Value v = Value::NewList();
        for (const auto& a : e.args) {
          WSUP_ASSIGN_OR_RETURN(Value x, Eval(*a));
          v.list->push_back(std::move(x));
        }
        return v;
      }
      case Expr::K::kDict: {
        Value v = Value::NewDict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          WSUP_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          if (k.t != T::kStr) return Fail(e.line, "a dict's keys must be strings here");
          WSUP_ASSIGN_OR_RETURN(Value x, Eval(*e.args[i + 1]));
          v.Put(k.s, std::move(x));
        }
        return v;
      }
      case Expr::K::kBinary: return Binary(e);
      case Expr::K::kCompare: return Compare(e);
    }
    return Fail(e.line, "an expression this renderer does not know");
  }

  // a.b and a[k]: a dict's member, a list's or string's element; a
  // missing one is undefined.
  Value Member(const Value& obj, const Value& key) {
    if ((obj.t == T::kDict || obj.t == T::kNs) && key.t == T::kStr) {
      if (const Value* v = obj.Find(key.s)) return *v;
      return Value::Undef("'" + std::string(TypeName(obj)) + " object' has no attribute '" + key.s + "'");
    }
    if ((obj.t == T::kList || obj.t == T::kStr) && IsIntLike(key)) {
      int64_t i = IntOf(key);
      if (obj.t == T::kList) {
        const auto n = static_cast<int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return (*obj.list)[static_cast<size_t>(i)];
      } else {
        const std::vector<uint32_t> cps = CodePoints(obj.s);
        const auto n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::Str(FromCodePoints(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
      }
      return Value::Undef(std::string(TypeName(obj)) + " index out of range");
    }
    return Value::Undef(std::string("'") + TypeName(obj) + " object' has no attribute '" + Str(key) + "'");
  }

  Result<Value> Slice(const Expr& e) {
    WSUP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    WSUP_RETURN_IF_ERROR(Defined(e.line, obj));
    int64_t bound[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[static_cast<size_t>(k) + 1]) continue;
      WSUP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[static_cast<size_t>(k) + 1]));
      if (v.t == T::kNone) continue;
      if (!IsIntLike(v)) return Fail(e.line, "slice indices must be integers");
      bound[k] = IntOf(v);
      given[k] = true;
    }
    const int64_t step = bound[2];
    if (step == 0) return Fail(e.line, "a slice's step cannot be zero");
    std::vector<Value> elems;
    std::vector<uint32_t> cps;
    int64_t n = 0;
    if (obj.t == T::kList) {
      n = static_cast<int64_t>(obj.list->size());
    } else if (obj.t == T::kStr) {
      cps = CodePoints(obj.s);
      n = static_cast<int64_t>(cps.size());
    } else {
      return Fail(e.line, std::string("a ") + TypeName(obj) + " cannot be sliced");
    }
    // Python's slice.indices().
    auto norm = [&](int64_t v, bool is_given, int64_t def) {
      if (!is_given) return def;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = norm(bound[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = norm(bound[1], given[1], step > 0 ? n : -1);
    Value out = obj.t == T::kList ? Value::NewList() : Value::Str("");
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.t == T::kList) {
        out.list->push_back((*obj.list)[static_cast<size_t>(i)]);
      } else {
        AppendUtf8(cps[static_cast<size_t>(i)], &out.s);
      }
    }
    return out;
  }

  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* Get(size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : kw) {
        if (k == name) return &v;
      }
      return nullptr;
    }
  };
  // The arguments of e from args[first] on.
  Result<Args> EvalArgs(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) {
      WSUP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      const std::string& kw = i < e.keywords.size() ? e.keywords[i] : std::string();
      if (kw.empty()) {
        a.pos.push_back(std::move(v));
      } else {
        a.kw.emplace_back(kw, std::move(v));
      }
    }
    return a;
  }

  Result<Value> Call(const Expr& e) {
    WSUP_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 0));
    if (e.name == "namespace") {
      Value ns = Value::NewDict(T::kNs);
      for (const auto& p : a.pos) {
        if (p.t != T::kDict) return Fail(e.line, "namespace() takes a dict or name=value arguments");
        for (const auto& [k, v] : *p.dict) ns.Put(k, v);
      }
      for (auto& [k, v] : a.kw) ns.Put(k, v);
      return ns;
    }
    if (e.name == "raise_exception") {
      const Value* m = a.Get(0, "message");
      return InvalidArgument(m ? Str(*m) : std::string("the chat template raised an exception"));
    }
    // range()
    std::vector<int64_t> r;
    for (const auto& p : a.pos) {
      if (!IsIntLike(p)) return Fail(e.line, "range() takes integers");
      r.push_back(IntOf(p));
    }
    if (r.empty() || r.size() > 3) return Fail(e.line, "range() takes 1 to 3 integers");
    const int64_t start = r.size() > 1 ? r[0] : 0, stop = r.size() > 1 ? r[1] : r[0], step = r.size() > 2 ? r[2] : 1;
    if (step == 0) return Fail(e.line, "range()'s step cannot be zero");
    Value out = Value::NewList();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (static_cast<int64_t>(out.list->size()) >= kMaxRange) return Fail(e.line, "range() is too long");
      out.list->push_back(Value::Int(i));
    }
    return out;
  }

  Result<Value> Method(const Expr& e) {
    WSUP_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    WSUP_RETURN_IF_ERROR(Defined(e.line, obj));
    WSUP_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
    const std::string& m = e.name;
    auto str_arg = [&](size_t i, const char* name) -> Result<const std::string*> {
      const Value* v = a.Get(i, name);
      if (!v || v->t == T::kNone) return static_cast<const std::string*>(nullptr);
      if (v->t != T::kStr) return Fail(e.line, m + "() takes a string argument, not " + TypeName(*v));
      return &v->s;
    };
    if (obj.t == T::kStr) {
      const std::string& s = obj.s;
      if (m == "startswith" || m == "endswith") {
        WSUP_ASSIGN_OR_RETURN(const std::string* x, str_arg(0, "prefix"));
        if (!x) return Fail(e.line, m + "() needs a string");
        const bool at = x->size() <= s.size() &&
                        (m == "startswith" ? s.compare(0, x->size(), *x) == 0
                                           : s.compare(s.size() - x->size(), x->size(), *x) == 0);
        return Value::Bool(at);
      }
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        WSUP_ASSIGN_OR_RETURN(const std::string* chars, str_arg(0, "chars"));
        return Value::Str(Strip(s, chars, m != "rstrip", m != "lstrip"));
      }
      if (m == "upper" || m == "lower") return Value::Str(MapCase(s, m == "upper"));
      if (m == "split") {
        WSUP_ASSIGN_OR_RETURN(const std::string* sep, str_arg(0, "sep"));
        int64_t maxsplit = -1;
        if (const Value* ms = a.Get(1, "maxsplit")) {
          if (!IsIntLike(*ms)) return Fail(e.line, "split()'s maxsplit must be an integer");
          maxsplit = IntOf(*ms);
        }
        return Split(e.line, s, sep, maxsplit);
      }
      if (m == "replace") {
        WSUP_ASSIGN_OR_RETURN(const std::string* from, str_arg(0, "old"));
        WSUP_ASSIGN_OR_RETURN(const std::string* to, str_arg(1, "new"));
        if (!from || !to) return Fail(e.line, "replace() needs two strings");
        if (from->empty()) return Fail(e.line, "replace() of an empty string is not supported");
        std::string out;
        size_t at = 0;
        for (size_t f; (f = s.find(*from, at)) != std::string::npos; at = f + from->size()) {
          out += s.substr(at, f - at) + *to;
        }
        return Value::Str(out + s.substr(at));
      }
    }
    if (obj.t == T::kDict) {
      if (m == "get") {
        const Value* k = a.Get(0, "key");
        if (!k) return Fail(e.line, "get() needs a key");
        if (k->t == T::kStr) {
          if (const Value* v = obj.Find(k->s)) return *v;
        }
        const Value* d = a.Get(1, "default");
        return d ? *d : Value::None();
      }
      if (m == "items" || m == "keys" || m == "values") {
        Value out = Value::NewList();
        for (const auto& [k, v] : *obj.dict) {
          if (m == "keys") {
            out.list->push_back(Value::Str(k));
          } else if (m == "values") {
            out.list->push_back(v);
          } else {
            Value pair = Value::NewList();
            pair.list->push_back(Value::Str(k));
            pair.list->push_back(v);
            out.list->push_back(std::move(pair));
          }
        }
        return out;
      }
    }
    return Fail(e.line, std::string("'") + TypeName(obj) + "' object has no method '" + m + "'");
  }

  Result<Value> Split(int line, const std::string& s, const std::string* sep, int64_t maxsplit) {
    Value out = Value::NewList();
    if (sep) {
      if (sep->empty()) return Fail(line, "split() with an empty separator");
      size_t at = 0;
      for (size_t f; (maxsplit < 0 || static_cast<int64_t>(out.list->size()) < maxsplit) &&
                     (f = s.find(*sep, at)) != std::string::npos;
           at = f + sep->size()) {
        out.list->push_back(Value::Str(s.substr(at, f - at)));
      }
      out.list->push_back(Value::Str(s.substr(at)));
      return out;
    }
    // Runs of whitespace; none at the ends.
    const std::vector<uint32_t> cps = CodePoints(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && PySpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.list->size()) >= maxsplit) {
        size_t end = cps.size();
        while (end > i && PySpace(cps[end - 1])) --end;
        out.list->push_back(Value::Str(FromCodePoints(cps, i, end)));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !PySpace(cps[j])) ++j;
      out.list->push_back(Value::Str(FromCodePoints(cps, i, j)));
      i = j;
    }
    return out;
  }

  Result<Value> Filter(const Expr& e) {
    WSUP_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    WSUP_ASSIGN_OR_RETURN(Args a, EvalArgs(e, 1));
    const std::string& f = e.name;
    if (f == "default" || f == "d") {
      const Value* d = a.Get(0, "default_value");
      const Value* boolean = a.Get(1, "boolean");
      const bool use = v.t == T::kUndef || (boolean && Truthy(*boolean) && !Truthy(v));
      return use ? (d ? *d : Value::Str("")) : v;
    }
    if (f == "string") {
      std::string s = Str(v);
      if (s.size() > kMaxString) return Fail(e.line, "a value passes 16 MiB");
      return Value::Str(std::move(s));
    }
    if (f == "tojson") {
      int indent = -1;
      if (const Value* in = a.Get(0, "indent"); in && in->t != T::kNone) {
        if (!IsIntLike(*in) || IntOf(*in) < 0 || IntOf(*in) > 64) return Fail(e.line, "tojson's indent must be 0 to 64");
        indent = static_cast<int>(IntOf(*in));
      }
      for (const auto& [k, x] : a.kw) {
        if (k != "indent") return Fail(e.line, "tojson's '" + k + "' is not supported (supported: indent)");
      }
      std::string out;
      Status st = Json(v, indent, 0, &out);
      if (!st.ok()) return Fail(e.line, st.error().message());
      return Value::Str(std::move(out));
    }
    if (f == "length" || f == "count") {
      switch (v.t) {
        case T::kUndef: return Value::Int(0);
        case T::kStr: return Value::Int(static_cast<int64_t>(CodePoints(v.s).size()));
        case T::kList: return Value::Int(static_cast<int64_t>(v.list->size()));
        case T::kDict: return Value::Int(static_cast<int64_t>(v.dict->size()));
        default: return Fail(e.line, std::string("object of type '") + TypeName(v) + "' has no len()");
      }
    }
    WSUP_RETURN_IF_ERROR(Defined(e.line, v));
    if (f == "trim") {
      const Value* chars = a.Get(0, "chars");
      const std::string s = Str(v);
      return Value::Str(Strip(s, chars && chars->t == T::kStr ? &chars->s : nullptr, true, true));
    }
    if (f == "upper" || f == "lower") return Value::Str(MapCase(Str(v), f == "upper"));
    if (f == "capitalize") {
      const std::string s = MapCase(Str(v), false);
      const std::vector<uint32_t> cps = CodePoints(s);
      if (cps.empty()) return Value::Str("");
      return Value::Str(MapCase(FromCodePoints(cps, 0, 1), true) + FromCodePoints(cps, 1));
    }
    if (f == "first" || f == "last" || f == "list" || f == "join") {
      WSUP_ASSIGN_OR_RETURN(std::vector<Value> items, Items(e.line, v));
      if (f == "list") {
        Value out = Value::NewList();
        *out.list = std::move(items);
        return out;
      }
      if (f == "join") {
        const Value* sep = a.Get(0, "d");
        std::string out;
        for (size_t i = 0; i < items.size(); ++i) {
          out += (i && sep ? Str(*sep) : "") + Str(items[i]);
          if (out.size() > kMaxString) return Fail(e.line, "a value passes 16 MiB");
        }
        return Value::Str(std::move(out));
      }
      if (items.empty()) return Value::Undef("no " + f + " item of an empty sequence");
      return f == "first" ? items.front() : items.back();
    }
    return Fail(e.line, "the filter '" + f + "' is not supported");
  }

  static bool Test(const std::string& t, const Value& v) {
    if (t == "defined") return v.t != T::kUndef;
    if (t == "undefined") return v.t == T::kUndef;
    if (t == "none") return v.t == T::kNone;
    if (t == "string") return v.t == T::kStr;
    if (t == "number") return IsNum(v);
    if (t == "integer") return v.t == T::kInt;
    if (t == "float") return v.t == T::kFloat;
    if (t == "boolean") return v.t == T::kBool;
    if (t == "mapping") return v.t == T::kDict;
    if (t == "sequence" || t == "iterable") return v.t == T::kStr || v.t == T::kList || v.t == T::kDict;
    if (t == "true") return v.t == T::kBool && v.b;
    if (t == "false") return v.t == T::kBool && !v.b;
    return false;
  }

  Result<Value> Binary(const Expr& e) {
    WSUP_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
    WSUP_ASSIGN_OR_RETURN(Value r, Eval(*e.args[1]));
    const std::string& op = e.name;
    if (op == "~") {
      std::string s = Str(l);
      if (s.size() <= kMaxString) s += Str(r);
      if (s.size() > kMaxString) return Fail(e.line, "a value passes 16 MiB");
      return Value::Str(std::move(s));
    }
    WSUP_RETURN_IF_ERROR(Defined(e.line, l));
    WSUP_RETURN_IF_ERROR(Defined(e.line, r));
    auto bad = [&]() {
      return Fail(e.line, "unsupported operand types for " + op + ": '" + TypeName(l) + "' and '" + TypeName(r) + "'");
    };
    if (op == "+") {
      if ((l.t == T::kStr && r.t == T::kStr && l.s.size() + r.s.size() > kMaxString) ||
          (l.t == T::kList && r.t == T::kList && l.list->size() + r.list->size() > static_cast<size_t>(kMaxRange))) {
        return Fail(e.line, "a value passes 16 MiB, or a list a million items");
      }
      if (l.t == T::kStr && r.t == T::kStr) return Value::Str(l.s + r.s);
      if (l.t == T::kList && r.t == T::kList) {
        Value out = Value::NewList();
        *out.list = *l.list;
        out.list->insert(out.list->end(), r.list->begin(), r.list->end());
        return out;
      }
    }
    if (op == "*" && ((l.t == T::kStr && IsIntLike(r)) || (IsIntLike(l) && r.t == T::kStr))) {
      const std::string& s = l.t == T::kStr ? l.s : r.s;
      const int64_t n = l.t == T::kStr ? IntOf(r) : IntOf(l);
      if (n > 0 && (s.size() * static_cast<size_t>(n) > kMaxString || static_cast<size_t>(n) > kMaxString)) {
        return Fail(e.line, "a value passes 16 MiB");
      }
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += s;
      return Value::Str(std::move(out));
    }
    if (!IsNum(l) || !IsNum(r)) return bad();
    const bool ints = IsIntLike(l) && IsIntLike(r);
    const int64_t a = IntOf(l), b = IntOf(r);
    const double x = Num(l), y = Num(r);
    int64_t out = 0;
    if (op == "+" && ints && !__builtin_add_overflow(a, b, &out)) return Value::Int(out);
    if (op == "-" && ints && !__builtin_sub_overflow(a, b, &out)) return Value::Int(out);
    if (op == "*" && ints && !__builtin_mul_overflow(a, b, &out)) return Value::Int(out);
    Value f;
    f.t = T::kFloat;
    if (op == "+") f.f = x + y;
    if (op == "-") f.f = x - y;
    if (op == "*") f.f = x * y;
    if (op == "**") {
      if (ints && b >= 0) {
        int64_t p = 1;
        for (int64_t i = 0; i < b; ++i) {
          if (__builtin_mul_overflow(p, a, &p)) return Fail(e.line, "an integer power is too large");
        }
        return Value::Int(p);
      }
      f.f = std::pow(x, y);
    }
    if (op == "/" || op == "//" || op == "%") {
      if (y == 0) return Fail(e.line, "division by zero");
      if (op == "/") f.f = x / y;
      if (ints && op == "//") return Value::Int(a / b - ((a % b != 0) && ((a < 0) != (b < 0))));
      if (ints && op == "%") return Value::Int(((a % b) + b) % b);
      if (op == "//") f.f = std::floor(x / y);
      if (op == "%") f.f = x - std::floor(x / y) * y;
    }
    return f;
  }

  Result<Value> Compare(const Expr& e) {
    WSUP_ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      WSUP_ASSIGN_OR_RETURN(Value r, Eval(*e.args[i + 1]));
      const std::string& op = e.ops[i];
      bool ok = false;
      if (op == "==") {
        ok = Equal(l, r);
      } else if (op == "!=") {
        ok = !Equal(l, r);
      } else if (op == "in" || op == "not in") {
        WSUP_RETURN_IF_ERROR(Defined(e.line, r));
        if (r.t == T::kStr) {
          if (l.t != T::kStr) return Fail(e.line, "'in <string>' requires a string on the left");
          ok = r.s.find(l.s) != std::string::npos;
        } else if (r.t == T::kList) {
          for (const auto& x : *r.list) ok = ok || Equal(l, x);
        } else if (r.t == T::kDict) {
          ok = l.t == T::kStr && r.Find(l.s) != nullptr;
        } else {
          return Fail(e.line, std::string("argument of type '") + TypeName(r) + "' is not iterable");
        }
        if (op == "not in") ok = !ok;
      } else {
        WSUP_RETURN_IF_ERROR(Defined(e.line, l));
        WSUP_RETURN_IF_ERROR(Defined(e.line, r));
        int c = 0;
        if (IsNum(l) && IsNum(r)) {
          if (IsIntLike(l) && IsIntLike(r)) {
            c = IntOf(l) < IntOf(r) ? -1 : IntOf(l) > IntOf(r);
          } else {
            c = Num(l) < Num(r) ? -1 : Num(l) > Num(r);
          }
        } else if (l.t == T::kStr && r.t == T::kStr) {
          c = l.s.compare(r.s);  // UTF-8's byte order is its code points'
        } else {
          return Fail(e.line, "'" + op + "' not supported between '" + TypeName(l) + "' and '" + TypeName(r) + "'");
        }
        ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
      }
      if (!ok) return Value::Bool(false);
      l = std::move(r);
    }
    return Value::Bool(true);
  }

  const std::string& name_;
  Value globals_;
  std::vector<Scope> scopes_;
  std::string out_;
  int64_t steps_ = 0;
};

}  // namespace

Result<std::string> Template::Render(const nlohmann::ordered_json& vars) const {
  Renderer r(name_, vars);
  return r.Run(*root_);
}

}  // namespace wsup::text::jinja
