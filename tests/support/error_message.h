#pragma once
// The message of the error a call throws, for tests that check what an error says.

#include <string>

#include <catch2/catch.hpp>

#include "hetseq/core/error.h"

namespace hetseq::test {

/// The message of the `Error` that `f` throws; fails the test when it throws nothing (another
/// exception type propagates and fails the test with its own message).
template <typename Error, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected the call to throw");
  return {};
}

/// The message of the hetseq::InputError that `f` throws.
template <typename F>
std::string input_error_of(F&& f) {
  return error_of<hetseq::InputError>(std::forward<F>(f));
}

/// Checks that `f` throws an `E` whose message contains `text`; fails the test when it throws nothing.
template <typename E, typename F>
void require_throws_naming(F&& f, const std::string& text) {
  try {
    f();
    FAIL("expected an exception naming " << text);
  } catch (const E& e) {
    CHECK_THAT(e.what(), Catch::Contains(text));
  }
}

}  // namespace hetseq::test
