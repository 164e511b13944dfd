#pragma once
/// What a fuzz harness (fuzz/*_fuzz.cpp) defines: one input in, accepted or rejected out. See Note [Fuzz harnesses].

#include <cstddef>
#include <cstdint>
#include <string>

namespace hetseq::fuzz {

// Note [Fuzz harnesses]
// ~~~~~~~~~~~~~~~~~~~~~
// A harness feeds one input to one reader of untrusted bytes (an IDX file, a BERT shard, a checkpoint, the command
// line of hetseq-train) and sorts what happens into three outcomes:
//   accepted   the reader returned; the harness then checks what it returned (shapes against the input's size, a
//              round trip), and a wrong result throws hetseq::InternalError (HETSEQ_ASSERT), which is a finding;
//   rejected   the reader threw the error it documents for bad input (hetseq::InputError for files,
//              hetseq::UsageError for the command line), with a message naming the file: the expected outcome;
//   a finding  anything else: a crash, a sanitizer report, a hang, or any other exception escaping run_input
//              (hetseq::InternalError, c10::Error, std::bad_alloc, ...).
// libFuzzer calls run_input through libfuzzer_entry.cpp (-DHETSEQ_FUZZ=ON, clang; scripts/fuzz.sh). The normal build
// links replay_main.cpp instead, and ctest replays fuzz/corpus/<harness>/ with it (fuzz_replay_<harness>): a finding
// fails the test, and so does a seed named valid-* that is rejected, because a corpus that no longer gets past a
// reader's first check is useless for fuzzing. fuzz/write_seeds.cpp writes the seeds.

/// What became of one input.
struct Outcome {
  bool accepted = true;
  std::string rejection;  // the message of the expected error, when rejected
};

/// Runs one input through the harness's reader. Defined once per harness; throws (or crashes) only on a finding.
Outcome run_input(const uint8_t* data, size_t size);

/// Runs `read` and returns accepted, or rejected with the message of the `ExpectedError` it throws. Any other
/// exception propagates: it is a finding.
template <class ExpectedError, class F>
Outcome run_expecting(F&& read) {
  try {
    read();
    return {};
  } catch (const ExpectedError& e) {
    return {false, e.what()};
  }
}

}  // namespace hetseq::fuzz
