// The parsed form of a chat template (jinja.h): values, expressions and
// statements. Internal to text/: jinja_parse.cc builds it, jinja_eval.cc
// runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace wsup::text::jinja {

// A value while rendering: JSON's kinds, Jinja's undefined, and a
// namespace (a dict that `set ns.x = ...` changes in place).
struct Value {
  enum class T : uint8_t { kUndef, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kNs };
  using List = std::vector<Value>;
  using Dict = std::vector<std::pair<std::string, Value>>;  // in insertion order
  T t = T::kUndef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                // kStr; kUndef: what was undefined, for errors
  std::shared_ptr<List> list;   // kList
  std::shared_ptr<Dict> dict;   // kDict, kNs

  static Value Str(std::string v) {
    Value x;
    x.t = T::kStr;
    x.s = std::move(v);
    return x;
  }
  static Value Int(int64_t v) {
    Value x;
    x.t = T::kInt;
    x.i = v;
    return x;
  }
  static Value Bool(bool v) {
    Value x;
    x.t = T::kBool;
    x.b = v;
    return x;
  }
  static Value None() {
    Value x;
    x.t = T::kNone;
    return x;
  }
  static Value Undef(std::string what) {
    Value x;
    x.s = std::move(what);
    return x;
  }
  static Value NewList() {
    Value x;
    x.t = T::kList;
    x.list = std::make_shared<List>();
    return x;
  }
  static Value NewDict(T kind = T::kDict) {
    Value x;
    x.t = kind;
    x.dict = std::make_shared<Dict>();
    return x;
  }
  // A dict's (or namespace's) member; nullptr when absent.
  const Value* Find(const std::string& key) const {
    if (!dict) return nullptr;
    for (const auto& [k, v] : *dict) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void Put(const std::string& key, Value v) {
    for (auto& [k, old] : *dict) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    dict->emplace_back(key, std::move(v));
  }
};

struct Expr {
  enum class K : uint8_t {
    kLit, kName, kAttr, kItem, kSlice, kCall, kMethod, kFilter, kTest,
    kNeg, kPos, kBinary, kCompare, kAnd, kOr, kNot, kCond, kList, kDict,
  };
  K k = K::kLit;
  int line = 0;
  Value lit;         // kLit
  std::string name;  // kName; kAttr's attribute; kCall's, kMethod's, kFilter's, kTest's name; kBinary's operator
  // Operands. kAttr: [obj]; kItem: [obj, index]; kSlice: [obj, start, stop,
  // step] (null where left out); kCall: args; kMethod, kFilter, kTest:
  // [subject, args...]; kNeg, kPos, kNot: [x]; kBinary, kAnd, kOr: [l, r];
  // kCompare: [first, then one per operator]; kCond: [then, cond, else or
  // null]; kList: items; kDict: [key, value, key, value, ...].
  std::vector<std::unique_ptr<Expr>> args;
  // kCall, kMethod, kFilter: the keyword of each argument (after the
  // subject), "" for a positional one.
  std::vector<std::string> keywords;
  std::vector<std::string> ops;  // kCompare's operators
  bool negated = false;          // kTest: "is not"
};

struct Node {
  enum class K : uint8_t { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue };
  K k = K::kText;
  int line = 0;
  std::string text;            // kText
  std::unique_ptr<Expr> expr;  // kOutput's value; kSet's value; kFor's iterable
  // kIf: a condition for each branch, the else branch last with none.
  std::vector<std::unique_ptr<Expr>> conds;
  // kIf: one body per branch; kFor: the body, and the else body.
  std::vector<std::vector<std::unique_ptr<Node>>> bodies;
  // kFor: the loop's names (one, or two unpacked); kSet: {name} or
  // {namespace, attribute}.
  std::vector<std::string> targets;
};

using Body = std::vector<std::unique_ptr<Node>>;

}  // namespace wsup::text::jinja
