// Parsing a chat template (jinja.h): the template's text cut into text and
// tags with Jinja2's whitespace rules as transformers configures them
// (trim_blocks, lstrip_blocks; - and + on a tag), each tag's expression
// tokens, and a recursive-descent parser with Jinja2's precedence. Every
// construct outside the subset is refused here, with its line, so that a
// template that parses renders as Jinja2 would.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/utf8.h"

namespace wsup::text::jinja {

namespace {

const char* const kFilters[] = {"length", "count", "trim",    "tojson", "upper", "lower", "string",
                                "default", "d",    "first",   "last",   "join",  "list",  "capitalize"};
const char* const kTests[] = {"defined",  "undefined", "none",     "string",   "number", "integer", "float",
                              "boolean",  "mapping",   "sequence", "iterable", "true",   "false"};
const char* const kMethods[] = {"startswith", "endswith", "split", "strip", "lstrip", "rstrip", "upper",
                                "lower",      "replace",  "get",   "items", "keys",   "values"};
const char* const kFunctions[] = {"namespace", "raise_exception", "range"};

template <size_t N>
bool OneOf(const std::string& s, const char* const (&set)[N]) {
  for (const char* x : set) {
    if (s == x) return true;
  }
  return false;
}

template <size_t N>
std::string List(const char* const (&set)[N]) {
  std::string out;
  for (const char* x : set) out += (out.empty() ? "" : ", ") + std::string(x);
  return out;
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

struct Tok {
  enum class K : uint8_t { kName, kInt, kFloat, kStr, kOp, kEnd };
  K k = K::kEnd;
  std::string v;  // a name, an operator, a string's value
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

// One piece of the template: text, or a tag's tokens (ending with kEnd).
struct Piece {
  enum class K : uint8_t { kText, kExpr, kStmt };
  K k = K::kText;
  std::string text;
  std::vector<Tok> toks;
  int line = 0;
};

class Parser {
 public:
  Parser(std::string src, std::string name) : src_(std::move(src)), name_(std::move(name)) {}

  Result<std::shared_ptr<const Body>> Run() {
    Status cut = Cut();
    if (!cut.ok()) return cut.error();
    auto root = std::make_shared<Body>();
    Status built = Build(root.get());
    if (!built.ok()) return built.error();
    return std::shared_ptr<const Body>(std::move(root));
  }

 private:
  Error Fail(int line, const std::string& what) const {
    return InvalidArgument(name_ + ": line " + std::to_string(line) + ": " + what);
  }
  Error Unsupported(int line, const std::string& what, const std::string& supported) const {
    return Fail(line, what + " is not supported (supported: " + supported +
                          "); wsup renders only what it renders exactly as Jinja2 does");
  }

  // ---- cutting the source into pieces ----
  Status Cut() {
    // Jinja2 reads \r\n and \r as \n and drops one trailing newline.
    std::string s;
    s.reserve(src_.size());
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\r') {
        s.push_back('\n');
        if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
      } else {
        s.push_back(src_[i]);
      }
    }
    if (!s.empty() && s.back() == '\n') s.pop_back();
    src_ = std::move(s);

    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t t = pos;
      while (t < n && !(src_[t] == '{' && t + 1 < n && (src_[t + 1] == '{' || src_[t + 1] == '%' || src_[t + 1] == '#'))) {
        ++t;
      }
      std::string text = src_.substr(pos, t - pos);
      const int text_line = line;
      for (char c : text) line += c == '\n';
      if (t >= n) {
        AddText(std::move(text), text_line);
        break;
      }
      const char kind = src_[t + 1];
      size_t q = t + 2;
      char mod = 0;
      if (q < n && (src_[q] == '-' || src_[q] == '+')) mod = src_[q++];
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: the spaces and tabs before a block or comment tag
        // that starts its line.
        const size_t nl = text.rfind('\n');
        const size_t l = nl == std::string::npos ? 0 : nl + 1;
        if ((l > 0 || line_starting) && text.size() > l) {
          bool blank = true;
          for (size_t i = l; i < text.size(); ++i) blank = blank && IsSpace(text[i]);
          if (blank) text.resize(l);
        }
      }
      AddText(std::move(text), text_line);

      size_t after = 0;
      bool strip_after = false, keep_newline = false;
      if (kind == '#') {
        size_t e = src_.find("#}", q);
        if (e == std::string::npos) return Fail(line, "a comment {# is never closed with #}");
        strip_after = e > q && src_[e - 1] == '-';
        keep_newline = e > q && src_[e - 1] == '+';
        for (size_t i = q; i < e; ++i) line += src_[i] == '\n';
        after = e + 2;
      } else {
        Piece p;
        p.k = kind == '{' ? Piece::K::kExpr : Piece::K::kStmt;
        p.line = line;
        WSUP_RETURN_IF_ERROR(LexTag(kind == '{' ? '}' : '%', &q, &line, &p.toks, &strip_after, &keep_newline));
        pieces_.push_back(std::move(p));
        after = q;
      }
      const size_t end_start = after;
      if (strip_after) {
        while (after < n && IsSpace(src_[after])) ++after;
      } else if (kind != '{' && !keep_newline && after < n && src_[after] == '\n') {
        ++after;  // trim_blocks
      }
      for (size_t i = end_start; i < after; ++i) line += src_[i] == '\n';
      // Whether the next text starts a line (for lstrip_blocks): what the
      // tag's end took ended with a newline.
      line_starting = after > end_start && src_[after - 1] == '\n';
      pos = after;
    }
    return Status::Ok();
  }

  void AddText(std::string text, int line) {
    if (text.empty()) return;
    Piece p;
    p.k = Piece::K::kText;
    p.text = std::move(text);
    p.line = line;
    pieces_.push_back(std::move(p));
  }

  // The tokens of a tag from *q to its end ("}}" or "%}", with - or +
  // before it); *q moves past the end.
  Status LexTag(char close, size_t* q, int* line, std::vector<Tok>* out, bool* strip_after, bool* keep_newline) {
    const size_t n = src_.size();
    size_t i = *q;
    const int start_line = *line;
    while (true) {
      while (i < n && IsSpace(src_[i])) *line += src_[i++] == '\n';
      if (i >= n) {
        return Fail(start_line, std::string("a tag is never closed with ") + (close == '}' ? "}}" : "%}"));
      }
      auto at = [&](const char* s) { return src_.compare(i, std::char_traits<char>::length(s), s) == 0; };
      const std::string end = std::string(1, close) + "}";
      if (at(("-" + end).c_str()) || at(("+" + end).c_str()) || at(end.c_str())) {
        if (src_[i] == '-') *strip_after = true;
        if (src_[i] == '+') *keep_newline = true;
        i += src_[i] == close ? 2 : 3;
        Tok e;
        e.line = *line;
        out->push_back(e);
        *q = i;
        return Status::Ok();
      }
      Tok t;
      t.line = *line;
      const char c = src_[i];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < n && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        t.k = Tok::K::kName;
        t.v = src_.substr(i, j - i);
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t j = i;
        bool is_float = false;
        while (j < n && (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        if (j + 1 < n && src_[j] == '.' && std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
          is_float = true;
          ++j;
          while (j < n && (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        }
        if (j < n && (src_[j] == 'e' || src_[j] == 'E')) {
          size_t k = j + 1;
          if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < n && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            j = k;
            while (j < n && std::isdigit(static_cast<unsigned char>(src_[j]))) ++j;
          }
        }
        std::string digits;
        for (size_t k = i; k < j; ++k) {
          if (src_[k] != '_') digits.push_back(src_[k]);
        }
        if (is_float) {
          t.k = Tok::K::kFloat;
          t.f = std::strtod(digits.c_str(), nullptr);
        } else {
          t.k = Tok::K::kInt;
          errno = 0;
          t.i = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) return Fail(*line, "the integer " + digits + " is too large");
        }
        i = j;
      } else if (c == '\'' || c == '"') {
        t.k = Tok::K::kStr;
        WSUP_RETURN_IF_ERROR(LexString(&i, line, &t.v));
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
        bool found = false;
        for (const char* op : kOps) {
          if (at(op)) {
            t.k = Tok::K::kOp;
            t.v = op;
            i += t.v.size();
            found = true;
            break;
          }
        }
        if (!found) return Fail(*line, std::string("unexpected character '") + c + "' in a tag");
      }
      out->push_back(std::move(t));
    }
  }

  // A string literal at *i, with Python's escapes (as Jinja2 reads them).
  Status LexString(size_t* i, int* line, std::string* out) {
    const char quote = src_[*i];
    size_t j = *i + 1;
    const size_t n = src_.size();
    auto hex = [&](size_t at, int digits, uint32_t* cp) {
      if (at + digits > n) return false;
      *cp = 0;
      for (int k = 0; k < digits; ++k) {
        const char h = src_[at + k];
        int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
                : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                            : -1;
        if (v < 0) return false;
        *cp = *cp * 16 + static_cast<uint32_t>(v);
      }
      return true;
    };
    while (j < n && src_[j] != quote) {
      if (src_[j] == '\n') ++*line;
      if (src_[j] != '\\' || j + 1 >= n) {
        out->push_back(src_[j++]);
        continue;
      }
      const char e = src_[j + 1];
      uint32_t cp = 0;
      switch (e) {
        case 'n': out->push_back('\n'); j += 2; break;
        case 't': out->push_back('\t'); j += 2; break;
        case 'r': out->push_back('\r'); j += 2; break;
        case '\\': out->push_back('\\'); j += 2; break;
        case '\'': out->push_back('\''); j += 2; break;
        case '"': out->push_back('"'); j += 2; break;
        case '\n': j += 2; ++*line; break;  // a continued line
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (!hex(j + 2, digits, &cp) || cp > 0x10ffff) {
            return Fail(*line, std::string("a string has a bad \\") + e + " escape");
          }
          AppendUtf8(cp, out);
          j += 2 + digits;
          break;
        }
        default:  // Python keeps an unknown escape as written
          out->push_back('\\');
          ++j;
      }
    }
    if (j >= n) return Fail(*line, "a string is never closed");
    *i = j + 1;
    return Status::Ok();
  }

  // ---- statements ----
  struct Frame {
    Node* node;
    Body* body;
    bool has_else = false;
  };

  Status Build(Body* root) {
    std::vector<Frame> stack;
    auto body = [&]() { return stack.empty() ? root : stack.back().body; };
    for (auto& p : pieces_) {
      if (p.k == Piece::K::kText) {
        auto node = std::make_unique<Node>();
        node->k = Node::K::kText;
        node->line = p.line;
        node->text = std::move(p.text);
        body()->push_back(std::move(node));
        continue;
      }
      toks_ = &p.toks;
      at_ = 0;
      if (p.k == Piece::K::kExpr) {
        auto node = std::make_unique<Node>();
        node->k = Node::K::kOutput;
        node->line = p.line;
        WSUP_ASSIGN_OR_RETURN(node->expr, ParseExpr());
        WSUP_RETURN_IF_ERROR(ExpectEnd("}}"));
        body()->push_back(std::move(node));
        continue;
      }
      const Tok& head = Next();
      if (head.k != Tok::K::kName) return Fail(p.line, "a {% %} tag must start with a statement's name");
      const std::string& kw = head.v;
      if (kw == "if") {
        auto node = std::make_unique<Node>();
        node->k = Node::K::kIf;
        node->line = p.line;
        std::unique_ptr<Expr> cond;
        WSUP_ASSIGN_OR_RETURN(cond, ParseExpr());
        node->conds.push_back(std::move(cond));
        node->bodies.emplace_back();
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
        Node* raw = node.get();
        body()->push_back(std::move(node));
        stack.push_back({raw, &raw->bodies.back()});
      } else if (kw == "elif" || kw == "else") {
        if (stack.empty() || stack.back().has_else) return Fail(p.line, "{% " + kw + " %} without an open {% if %} or {% for %}");
        Frame& f = stack.back();
        if (f.node->k == Node::K::kFor) {
          if (kw == "elif") return Fail(p.line, "{% elif %} inside a {% for %}");
          f.node->bodies.emplace_back();
          f.body = &f.node->bodies.back();
          f.has_else = true;
          WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
          continue;
        }
        std::unique_ptr<Expr> cond;
        if (kw == "elif") {
          WSUP_ASSIGN_OR_RETURN(cond, ParseExpr());
        } else {
          f.has_else = true;
        }
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
        f.node->conds.push_back(std::move(cond));
        f.node->bodies.emplace_back();
        f.body = &f.node->bodies.back();
      } else if (kw == "endif" || kw == "endfor") {
        const Node::K want = kw == "endif" ? Node::K::kIf : Node::K::kFor;
        if (stack.empty() || stack.back().node->k != want) {
          return Fail(p.line, "{% " + kw + " %} does not close the innermost open block");
        }
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
        stack.pop_back();
      } else if (kw == "for") {
        auto node = std::make_unique<Node>();
        node->k = Node::K::kFor;
        node->line = p.line;
        do {
          const Tok& name = Next();
          if (name.k != Tok::K::kName) return Fail(p.line, "{% for %} needs a name before 'in'");
          node->targets.push_back(name.v);
        } while (AcceptOp(","));
        if (node->targets.size() > 2) return Unsupported(p.line, "unpacking into more than two names", "one or two");
        if (!AcceptName("in")) return Fail(p.line, "{% for %} needs 'in'");
        WSUP_ASSIGN_OR_RETURN(node->expr, ParseOr());
        if (Peek().k == Tok::K::kName && (Peek().v == "if" || Peek().v == "recursive")) {
          return Unsupported(p.line, "a loop's '" + Peek().v + "'", "for NAME in EXPR");
        }
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
        node->bodies.emplace_back();
        Node* raw = node.get();
        body()->push_back(std::move(node));
        stack.push_back({raw, &raw->bodies.back()});
      } else if (kw == "set") {
        auto node = std::make_unique<Node>();
        node->k = Node::K::kSet;
        node->line = p.line;
        const Tok& name = Next();
        if (name.k != Tok::K::kName) return Fail(p.line, "{% set %} needs a name");
        node->targets.push_back(name.v);
        if (AcceptOp(".")) {
          const Tok& attr = Next();
          if (attr.k != Tok::K::kName) return Fail(p.line, "{% set ns.NAME = ... %} needs an attribute name");
          node->targets.push_back(attr.v);
        }
        if (!AcceptOp("=")) {
          return Unsupported(p.line, "{% set %} without '=' (a block set) or with several names", "{% set NAME = EXPR %}");
        }
        WSUP_ASSIGN_OR_RETURN(node->expr, ParseExpr());
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
        body()->push_back(std::move(node));
      } else if (kw == "break" || kw == "continue") {
        bool in_for = false;
        for (const auto& f : stack) in_for = in_for || (f.node->k == Node::K::kFor && !f.has_else);
        if (!in_for) return Fail(p.line, "{% " + kw + " %} outside a loop");
        auto node = std::make_unique<Node>();
        node->k = kw == "break" ? Node::K::kBreak : Node::K::kContinue;
        node->line = p.line;
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
        body()->push_back(std::move(node));
      } else if (kw == "generation" || kw == "endgeneration") {
        // transformers' marker of the assistant's tokens: renders nothing.
        WSUP_RETURN_IF_ERROR(ExpectEnd("%}"));
      } else {
        return Unsupported(p.line, "{% " + kw + " %}",
                           "if, elif, else, endif, for, else, endfor, set, break, continue, generation");
      }
    }
    if (!stack.empty()) {
      const Node* open = stack.back().node;
      return Fail(open->line, std::string("this {% ") + (open->k == Node::K::kIf ? "if" : "for") +
                                  " %} is never closed with {% " + (open->k == Node::K::kIf ? "endif" : "endfor") +
                                  " %}");
    }
    return Status::Ok();
  }

  // ---- expressions ----
  const Tok& Peek(size_t ahead = 0) const {
    const size_t i = std::min(at_ + ahead, toks_->size() - 1);
    return (*toks_)[i];
  }
  const Tok& Next() {
    const Tok& t = Peek();
    if (at_ + 1 < toks_->size()) ++at_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const { return Peek(ahead).k == Tok::K::kOp && Peek(ahead).v == op; }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).k == Tok::K::kName && Peek(ahead).v == name;
  }
  bool AcceptOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool AcceptName(const char* name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  Status ExpectOp(const char* op) {
    if (AcceptOp(op)) return Status::Ok();
    return Fail(Peek().line, std::string("expected '") + op + "', found " + Describe(Peek()));
  }
  Status ExpectEnd(const char* end) {
    if (Peek().k == Tok::K::kEnd) return Status::Ok();
    return Fail(Peek().line, std::string("expected the end of the tag (") + end + "), found " + Describe(Peek()));
  }
  static std::string Describe(const Tok& t) {
    switch (t.k) {
      case Tok::K::kEnd: return "the end of the tag";
      case Tok::K::kStr: return "a string";
      case Tok::K::kInt:
      case Tok::K::kFloat: return "a number";
      default: return "'" + t.v + "'";
    }
  }

  using P = Result<std::unique_ptr<Expr>>;
  static std::unique_ptr<Expr> Make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  P ParseExpr() {
    // Nesting is bounded: a template is a file from the checkpoint, and a
    // bad one must not overflow the stack.
    Depth depth(this);
    if (!depth.ok()) return Fail(Peek().line, "expressions nest deeper than " + std::to_string(kMaxDepth) + " levels");
    WSUP_ASSIGN_OR_RETURN(auto e, ParseOr());
    while (IsName("if")) {
      const int line = Next().line;
      auto c = Make(Expr::K::kCond, line);
      WSUP_ASSIGN_OR_RETURN(auto cond, ParseOr());
      std::unique_ptr<Expr> other;
      if (AcceptName("else")) {
        WSUP_ASSIGN_OR_RETURN(other, ParseExpr());
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }
  // `next (word next)*`, left to right, as `kind` nodes.
  P Logical(Expr::K kind, const char* word, P (Parser::*next)()) {
    WSUP_ASSIGN_OR_RETURN(auto e, (this->*next)());
    while (IsName(word)) {
      auto n = Make(kind, Next().line);
      WSUP_ASSIGN_OR_RETURN(auto r, (this->*next)());
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(r));
      e = std::move(n);
    }
    return e;
  }
  P ParseOr() { return Logical(Expr::K::kOr, "or", &Parser::ParseAnd); }
  P ParseAnd() { return Logical(Expr::K::kAnd, "and", &Parser::ParseNot); }
  P ParseNot() {
    Depth depth(this);
    if (!depth.ok()) return Fail(Peek().line, "expressions nest deeper than " + std::to_string(kMaxDepth) + " levels");
    if (IsName("not")) {
      auto n = Make(Expr::K::kNot, Next().line);
      WSUP_ASSIGN_OR_RETURN(auto x, ParseNot());
      n->args.push_back(std::move(x));
      return n;
    }
    return ParseCompare();
  }
  P ParseCompare() {
    WSUP_ASSIGN_OR_RETURN(auto e, ParseMath1());
    const int line = e->line;
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (Peek().k == Tok::K::kOp &&
          (Peek().v == "==" || Peek().v == "!=" || Peek().v == "<" || Peek().v == ">" || Peek().v == "<=" ||
           Peek().v == ">=")) {
        op = Next().v;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::K::kCompare, line);
        cmp->args.push_back(std::move(e));
      }
      WSUP_ASSIGN_OR_RETURN(auto r, ParseMath1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(r));
    }
    if (cmp) return cmp;
    return e;
  }
  P Binary(P (Parser::*next)(), std::initializer_list<const char*> ops) {
    WSUP_ASSIGN_OR_RETURN(auto e, (this->*next)());
    while (true) {
      const char* found = nullptr;
      for (const char* op : ops) {
        if (IsOp(op)) found = op;
      }
      if (!found) return e;
      auto n = Make(Expr::K::kBinary, Next().line);
      n->name = found;
      WSUP_ASSIGN_OR_RETURN(auto r, (this->*next)());
      n->args.push_back(std::move(e));
      n->args.push_back(std::move(r));
      e = std::move(n);
    }
  }
  P ParseMath1() { return Binary(&Parser::ParseConcat, {"+", "-"}); }
  P ParseConcat() { return Binary(&Parser::ParseMath2, {"~"}); }
  P ParseMath2() { return Binary(&Parser::ParsePow, {"*", "/", "//", "%"}); }
  P ParsePow() { return Binary(&Parser::ParseUnary, {"**"}); }
  P ParseUnary() {
    Depth depth(this);
    if (!depth.ok()) return Fail(Peek().line, "expressions nest deeper than " + std::to_string(kMaxDepth) + " levels");
    if (IsOp("-") || IsOp("+")) {
      auto n = Make(IsOp("-") ? Expr::K::kNeg : Expr::K::kPos, Peek().line);
      Next();
      WSUP_ASSIGN_OR_RETURN(auto x, ParseUnary());
      n->args.push_back(std::move(x));
      return n;
    }
    WSUP_ASSIGN_OR_RETURN(auto e, ParsePrimary());
    WSUP_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    return ParseFilters(std::move(e));
  }

  P ParsePrimary() {
    const Tok& t = Next();
    auto lit = [&](Value v) {
      auto e = Make(Expr::K::kLit, t.line);
      e->lit = std::move(v);
      return e;
    };
    switch (t.k) {
      case Tok::K::kStr: {
        std::string s = t.v;
        while (Peek().k == Tok::K::kStr) s += Next().v;  // adjacent literals join
        return lit(Value::Str(std::move(s)));
      }
      case Tok::K::kInt: return lit(Value::Int(t.i));
      case Tok::K::kFloat: {
        Value v;
        v.t = Value::T::kFloat;
        v.f = t.f;
        return lit(v);
      }
      case Tok::K::kName: {
        if (t.v == "true" || t.v == "True") return lit(Value::Bool(true));
        if (t.v == "false" || t.v == "False") return lit(Value::Bool(false));
        if (t.v == "none" || t.v == "None") return lit(Value::None());
        auto e = Make(Expr::K::kName, t.line);
        e->name = t.v;
        return e;
      }
      case Tok::K::kOp:
        if (t.v == "(") {
          WSUP_ASSIGN_OR_RETURN(auto e, ParseExpr());
          if (IsOp(",")) return Unsupported(t.line, "a tuple", "lists: [a, b]");
          WSUP_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.v == "[") {
          auto e = Make(Expr::K::kList, t.line);
          while (!IsOp("]")) {
            WSUP_ASSIGN_OR_RETURN(auto item, ParseExpr());
            e->args.push_back(std::move(item));
            if (!AcceptOp(",")) break;
          }
          WSUP_RETURN_IF_ERROR(ExpectOp("]"));
          return e;
        }
        if (t.v == "{") {
          auto e = Make(Expr::K::kDict, t.line);
          while (!IsOp("}")) {
            WSUP_ASSIGN_OR_RETURN(auto key, ParseExpr());
            WSUP_RETURN_IF_ERROR(ExpectOp(":"));
            WSUP_ASSIGN_OR_RETURN(auto value, ParseExpr());
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
            if (!AcceptOp(",")) break;
          }
          WSUP_RETURN_IF_ERROR(ExpectOp("}"));
          return e;
        }
        break;
      default: break;
    }
    return Fail(t.line, "expected a value, found " + Describe(t));
  }

  // Arguments after '(' up to ')': positional, then keyword (name=value).
  Status ParseArgs(Expr* call) {
    while (!IsOp(")")) {
      std::string kw;
      if (Peek().k == Tok::K::kName && IsOp("=", 1)) {
        kw = Next().v;
        Next();
      }
      WSUP_ASSIGN_OR_RETURN(auto a, ParseExpr());
      call->args.push_back(std::move(a));
      call->keywords.push_back(kw);
      if (!AcceptOp(",")) break;
    }
    return ExpectOp(")");
  }

  P ParsePostfix(std::unique_ptr<Expr> e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        const Tok& name = Next();
        if (name.k != Tok::K::kName && name.k != Tok::K::kInt) return Fail(line, "expected a name after '.'");
        if (IsOp("(")) {
          Next();
          if (!OneOf(name.v, kMethods)) return Unsupported(line, "the method '" + name.v + "'", List(kMethods));
          auto m = Make(Expr::K::kMethod, line);
          m->name = name.v;
          m->args.push_back(std::move(e));
          m->keywords.emplace_back();
          WSUP_RETURN_IF_ERROR(ParseArgs(m.get()));
          e = std::move(m);
          continue;
        }
        auto a = Make(Expr::K::kAttr, line);
        a->name = name.k == Tok::K::kInt ? std::to_string(name.i) : name.v;
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        const int line = Next().line;
        std::unique_ptr<Expr> parts[3];
        int colons = 0;
        while (true) {
          if (!IsOp(":") && !IsOp("]")) {
            WSUP_ASSIGN_OR_RETURN(parts[colons], ParseExpr());
          }
          if (colons < 2 && AcceptOp(":")) {
            ++colons;
            continue;
          }
          break;
        }
        WSUP_RETURN_IF_ERROR(ExpectOp("]"));
        if (colons == 0) {
          if (!parts[0]) return Fail(line, "an empty subscript []");
          auto it = Make(Expr::K::kItem, line);
          it->args.push_back(std::move(e));
          it->args.push_back(std::move(parts[0]));
          e = std::move(it);
        } else {
          auto sl = Make(Expr::K::kSlice, line);
          sl->args.push_back(std::move(e));
          for (auto& p : parts) sl->args.push_back(std::move(p));
          e = std::move(sl);
        }
      } else if (IsOp("(")) {
        const int line = Next().line;
        if (e->k != Expr::K::kName) return Unsupported(line, "calling this value", "methods and " + List(kFunctions));
        if (!OneOf(e->name, kFunctions)) return Unsupported(line, "the function '" + e->name + "'", List(kFunctions));
        auto c = Make(Expr::K::kCall, line);
        c->name = e->name;
        WSUP_RETURN_IF_ERROR(ParseArgs(c.get()));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  P ParseFilters(std::unique_ptr<Expr> e) {
    while (true) {
      if (IsOp("|")) {
        const int line = Next().line;
        const Tok& name = Next();
        if (name.k != Tok::K::kName) return Fail(line, "expected a filter's name after '|'");
        if (!OneOf(name.v, kFilters)) return Unsupported(line, "the filter '" + name.v + "'", List(kFilters));
        auto f = Make(Expr::K::kFilter, line);
        f->name = name.v;
        f->args.push_back(std::move(e));
        f->keywords.emplace_back();
        if (AcceptOp("(")) WSUP_RETURN_IF_ERROR(ParseArgs(f.get()));
        WSUP_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(f)));
      } else if (IsName("is")) {
        const int line = Next().line;
        auto t = Make(Expr::K::kTest, line);
        t->negated = AcceptName("not");
        const Tok& name = Next();
        if (name.k != Tok::K::kName) return Fail(line, "expected a test's name after 'is'");
        // none, true and false are names here, not literals.
        if (!OneOf(name.v, kTests)) return Unsupported(line, "the test '" + name.v + "'", List(kTests));
        t->name = name.v;
        t->args.push_back(std::move(e));
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::string src_;
  std::string name_;
  std::vector<Piece> pieces_;
  const std::vector<Tok>* toks_ = nullptr;
  size_t at_ = 0;
  static constexpr int kMaxDepth = 100;
  int depth_ = 0;
  // One level of nesting while it lives.
  class Depth {
   public:
    explicit Depth(Parser* p) : p_(p) { ++p_->depth_; }
    ~Depth() { --p_->depth_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
    bool ok() const { return p_->depth_ <= kMaxDepth; }

   private:
    Parser* p_;
  };
};

}  // namespace

Result<Template> Template::Parse(std::string_view source, const std::string& name) {
  Parser p{std::string(source), name};
  auto root = p.Run();
  if (!root.ok()) return root.error();
  Template t;
  t.root_ = std::move(root).value();
  t.name_ = name;
  return t;
}

}  // namespace wsup::text::jinja
