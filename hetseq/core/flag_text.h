#pragma once
/// A value written as on a command line: how a component's FlagSet takes its flags' defaults from its
/// options struct (`flags.add("seed", ..., flag_text(CommonOptions{}.seed))`), so that a default is
/// written once, in the struct. The text reads back to the same value with the strict parsers of
/// hetseq/core/parse.h (numbers in their shortest exact form, lists comma-separated).

#include <chrono>
#include <string>
#include <vector>

#include "hetseq/core/format.h"

namespace hetseq {

/// A number or a string as text: 25.0 is "25", 1e-4 is "0.0001", a string is itself.
template <class T>
std::string flag_text(const T& value) {
  return fmt::format("{}", value);
}

/// A list as a comma list: {1, 2} is "1,2" (what parse_int_list and parse_double_list read).
template <class T>
std::string flag_text(const std::vector<T>& values) {
  return fmt::format("{}", fmt::join(values, ","));
}

/// A duration in whole seconds, the unit of hetseq's timeout flags.
template <class Rep, class Period>
std::string flag_text(const std::chrono::duration<Rep, Period>& d) {
  return fmt::format("{}", std::chrono::duration_cast<std::chrono::seconds>(d).count());
}

}  // namespace hetseq
