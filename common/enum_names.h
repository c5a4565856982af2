// EnumNames: the names of an enum's values, as one list in the enum's order
// instead of a switch per enum. The list is checked against the enum's last
// value when it is compiled, so a value cannot be added without its name.
// Used for the state tables' states, events and actions (state_table.h) and
// for every other enum whose names are a contract (logs, status, JSON).
//
// Pure and constant: safe from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace wsup {

// The names of an enum's values, listed in the enum's order; kLast is its
// last value, and the values run 0, 1, 2, ... up to it. A value out of
// range (a cast from a bad integer) is named `out_of_range`.
template <auto kLast>
class EnumNames {
 public:
  using Enum = decltype(kLast);
  static constexpr size_t kCount = static_cast<size_t>(kLast) + 1;

  template <typename... Names>
  consteval explicit EnumNames(Names... names) : names_{names...} {
    static_assert(sizeof...(Names) == kCount, "one name for each value of the enum, in its order");
  }

  constexpr const char* operator()(Enum e, const char* out_of_range = "?") const {
    const auto i = static_cast<size_t>(e);
    return i < kCount ? names_[i] : out_of_range;
  }

  // The value with this name, or nullopt: the way back from a config's or a
  // message's word.
  constexpr std::optional<Enum> Parse(std::string_view name) const {
    for (size_t i = 0; i < kCount; ++i) {
      if (name == names_[i]) return static_cast<Enum>(i);
    }
    return std::nullopt;
  }

 private:
  const char* names_[kCount];
};

}  // namespace wsup
