// The check every state table's test starts with: no (state, event) pair
// has two rows.
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <functional>
#include <set>
#include <type_traits>
#include <utility>

namespace wsup::test {

// Each (from, event) pair of the n rows of table t appears once. A failure
// names its row ("<state> x <event>", through state_name and event_name);
// `each`, where given, checks every row too, under the same name.
template <typename Row, typename StateName, typename EventName>
void CheckPairsOnce(const Row* t, size_t n, StateName state_name, EventName event_name,
                    const std::type_identity_t<std::function<void(const Row&)>>& each = nullptr) {
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < n; ++i) {
    INFO(state_name(t[i].from) << " x " << event_name(t[i].event));
    CHECK(seen.insert({static_cast<int>(t[i].from), static_cast<int>(t[i].event)}).second);
    if (each) each(t[i]);
  }
}

}  // namespace wsup::test
