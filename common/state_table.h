// StateTable: the one mechanism behind wsup's state x event tables (the
// engine slots', the other children's, the KV pool's and the rollout's in
// supervisor/, the holder's layouts, the engine's own lifecycle).
//
// A table is a constant array of rows {from, event, to, action}, written in
// the file of the machine it describes so that reading the rows is reading
// the lifecycle. Each (from, event) pair appears at most once. A pair with
// no row is a refused transition: the event means nothing in that state,
// and the owner logs it (Refused) and keeps its state rather than guess.
// A move is logged as its row's text (Move), the same form for every table.
//
// Names come from one list per enum (EnumNames, common/enum_names.h).
//
// Pure and constant: safe from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "common/enum_names.h"

namespace wsup {

// In state `from`, `event` leads to `to`, and the table's owner does `action`.
template <typename State, typename Event, typename Action>
struct TableRow {
  State from;
  Event event;
  State to;
  Action action;
};

// The row for (from, event), or nullopt: a refused transition. `also`
// narrows the rows further where one array holds several machines (the
// child table's kinds).
template <typename Row, size_t N, typename Also>
constexpr std::optional<Row> FindRow(const Row (&rows)[N], decltype(Row::from) from, decltype(Row::event) event,
                                     Also also) {
  for (const Row& r : rows) {
    if (r.from == from && r.event == event && also(r)) return r;
  }
  return std::nullopt;
}

template <typename Row, size_t N>
constexpr std::optional<Row> FindRow(const Row (&rows)[N], decltype(Row::from) from, decltype(Row::event) event) {
  return FindRow(rows, from, event, [](const Row&) { return true; });
}

// The whole array, for tests and `wsup status --explain`.
template <typename Row, size_t N>
const Row* AllRows(const Row (&rows)[N], size_t* count) {
  *count = N;
  return rows;
}

// The three name functions of a table, and the two lines its owner logs.
template <typename State, typename Event, typename Action>
struct TableNames {
  const char* (*state)(State);
  const char* (*event)(Event);
  const char* (*action)(Action);

  // "standby --promote--> active [route_here]"
  template <typename Row>
  std::string Move(const Row& r) const {
    return std::string(state(r.from)) + " --" + event(r.event) + "--> " + state(r.to) + " [" + action(r.action) +
           "]";
  }

  // "event promote refused in state starting (no row)"
  std::string Refused(State s, Event e) const {
    return std::string("event ") + event(e) + " refused in state " + state(s) + " (no row)";
  }
};

}  // namespace wsup
