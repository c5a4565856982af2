// A chat template engine: the subset of Jinja2 that checkpoints' chat
// templates use, rendering exactly as transformers' apply_chat_template
// does (a sandboxed Jinja2 environment with trim_blocks, lstrip_blocks and
// the loop controls; its own tojson; raise_exception).
//
// The subset:
//   tags       {{ }}, {% %}, {# #}, with - and + whitespace control
//   statements if/elif/else, for/else (with loop.index0, index, first,
//              last, length, revindex, revindex0; break, continue), set
//              (a name, or a namespace's attribute), generation
//   expressions literals (strings, numbers, true/false/none, lists,
//              dicts), names, a.b, a[i], a[i:j:k], calls of the methods
//              and functions below, + - * / // % ~, comparisons, in,
//              not in, and, or, not, x if c else y, filters, tests
//   filters    length count trim tojson upper lower string default d
//              first last join list capitalize
//   tests      defined undefined none string number integer float
//              boolean mapping sequence iterable true false
//   methods    strings: startswith endswith split strip lstrip rstrip
//              upper lower replace; dicts: get items keys values
//   functions  namespace(...), raise_exception(message), range(...)
// Anything else (macros, includes, blocks, unknown filters or tests or
// methods) refuses the parse, naming the template's line and what is
// supported: a template rendered wrongly gives the model a prompt it was
// not trained on, and nothing would say so.
//
// A Template is immutable after Parse(); Render() may run on any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::text::jinja {

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

class Template {
 public:
  // `name` names the template in errors ("tokenizer_config.json chat_template").
  static Result<Template> Parse(std::string_view source, const std::string& name);

  // The variables are `vars`' members (messages, add_generation_prompt,
  // bos_token, ...), JSON values; key order is kept (tojson writes it).
  // An error names the line and what went wrong; raise_exception's message
  // is the error's.
  Result<std::string> Render(const nlohmann::ordered_json& vars) const;

 private:
  std::shared_ptr<const Body> root_;
  std::string name_;
};

}  // namespace wsup::text::jinja
