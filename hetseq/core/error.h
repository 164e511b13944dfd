#pragma once
/// Errors of hetseq. See STYLE: a user or input error throws with a message that says what, where and
/// what to do; a broken internal invariant is an assertion. Both are exceptions so failure paths are
/// testable; the drivers turn them into one line and an exit code.

#include <stdexcept>
#include <string>

#include "hetseq/core/format.h"

namespace hetseq {

/// A bad command line: unknown or malformed flag, invalid combination. Drivers exit with code 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

/// Bad input found while working: a missing or corrupt file, an unwritable directory, ranks that
/// disagree. Drivers exit with code 1.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

/// A broken internal invariant (a bug in hetseq, not in the user's input).
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
[[noreturn]] void assertion_failed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace hetseq

/// Checks an internal invariant; throws hetseq::InternalError with file and line when it is broken.
#define HETSEQ_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      ::hetseq::detail::assertion_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                         \
  } while (0)
