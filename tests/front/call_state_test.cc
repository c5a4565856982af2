// A call's lifecycle table (front/call_state.h), row by row, and the moves it
// must refuse. The rows expected are docs/front.md's table, read from the
// page: the code and the documentation cannot disagree.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "front/call_state.h"

using namespace wsup::front;
using S = CallState;
using E = CallEvent;

namespace {

struct Row {
  S from;
  E event;
  S to;
};

constexpr S kStates[] = {S::kNew,       S::kQueued,       S::kSent,       S::kRelaying, S::kResumeNew,
                         S::kResumeQueued, S::kResumeSent, S::kResuming, S::kDone};
constexpr E kEvents[] = {E::kQueue, E::kSend, E::kHead, E::kRetry, E::kResume, E::kAdopt, E::kAdoptResume, E::kFinish};

// The rows of docs/front.md's call-state table ("| from | event | to |"
// between its markers), by the code's names.
std::vector<Row> DocumentedRows() {
  const std::string path = std::string(WSUP_DOCS_DIR) + "/front.md";
  std::ifstream in(path);
  INFO(path);
  REQUIRE(in.good());
  auto state = [](const std::string& name) {
    for (S s : kStates) {
      if (name == CallStateName(s)) return s;
    }
    FAIL("docs/front.md names a call state the code does not have: '" << name << "'");
    return S::kDone;
  };
  auto event = [](const std::string& name) {
    for (E e : kEvents) {
      if (name == CallEventName(e)) return e;
    }
    FAIL("docs/front.md names a call event the code does not have: '" << name << "'");
    return E::kFinish;
  };
  std::vector<Row> rows;
  bool inside = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("call-state-table: begin") != std::string::npos) inside = true;
    if (line.find("call-state-table: end") != std::string::npos) break;
    if (!inside || line.rfind("| ", 0) != 0 || line.find("---") != std::string::npos) continue;
    std::istringstream cells(line);
    std::string bar, from, ev, to;
    cells >> bar >> from >> bar >> ev >> bar >> to;
    if (from == "from") continue;  // the header
    rows.push_back({state(from), event(ev), state(to)});
  }
  REQUIRE(rows.size() > 10);  // the markers and the table were found
  return rows;
}

}  // namespace

TEST_CASE("front call state: each row of the table", "[front][call_state]") {
  const std::vector<Row> expected = DocumentedRows();
  for (const Row& r : expected) {
    INFO(CallStateName(r.from) << " + " << CallEventName(r.event));
    auto next = NextCallState(r.from, r.event);
    REQUIRE(next.has_value());
    CHECK(*next == r.to);
  }
  CHECK(CallTransitions().size() == expected.size());
}

TEST_CASE("front call state: every other move is refused", "[front][call_state]") {
  const std::vector<Row> expected = DocumentedRows();
  std::set<std::pair<S, E>> allowed;
  for (const Row& r : expected) allowed.insert({r.from, r.event});
  int refused = 0;
  for (S s : kStates) {
    for (E e : kEvents) {
      if (allowed.count({s, e})) continue;
      INFO(CallStateName(s) << " + " << CallEventName(e));
      CHECK_FALSE(NextCallState(s, e).has_value());
      ++refused;
    }
  }
  CHECK(refused == 9 * 8 - static_cast<int>(expected.size()));
}

TEST_CASE("front call state: done is final, every state can finish", "[front][call_state]") {
  for (E e : kEvents) CHECK_FALSE(NextCallState(S::kDone, e).has_value());
  for (S s : kStates) {
    if (s != S::kDone) CHECK(NextCallState(s, E::kFinish) == S::kDone);
  }
}

TEST_CASE("front call state: a stream once resumed stays resumed, the queue is one state each side", "[front][call_state]") {
  for (const Row& r : DocumentedRows()) {
    if (IsResuming(r.from) && r.to != S::kDone) CHECK(IsResuming(r.to));
  }
  CHECK(IsQueued(S::kQueued));
  CHECK(IsQueued(S::kResumeQueued));
  CHECK_FALSE(IsQueued(S::kSent));
  CHECK_FALSE(IsResuming(S::kRelaying));
  std::set<std::string> names;
  for (S s : kStates) names.insert(CallStateName(s));
  CHECK(names.size() == std::size(kStates));
}
