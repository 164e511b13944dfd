#pragma once
// A rank made slow by a fixed cost per micro-batch, for the balancer's tests (tests/balance/): the
// before_micro_batch test hook (Note [Test hooks], hetseq/core/test_hooks.cpp) sleeps the milliseconds that a
// file holds, read anew at each micro-batch, so that a test can change the cost while the run goes on.

#include <functional>
#include <string>

namespace hetseq::test {

/// The variable that hetseq-train-hooked reads (support/hooked_train.h): HETSEQ_TEST_MICRO_BATCH_DELAY=FILE
/// makes each micro-batch sleep the milliseconds that FILE holds.
inline constexpr const char* kMicroBatchDelayEnv = "HETSEQ_TEST_MICRO_BATCH_DELAY";

/// A before_micro_batch hook that sleeps the milliseconds `file` holds when the hook runs (none while the file
/// is missing, empty or holds no positive number).
std::function<void()> micro_batch_delay(std::string file);

}  // namespace hetseq::test
