// Fuzz harness: the checkpoint decoder (decode_checkpoint, hetseq/checkpoint/checkpoint.h), on checkpoint files and
// on the records inside one. See Note [Fuzz harnesses] and Note [Checkpoint fuzz inputs].
#include <vector>

#include "fuzz/checkpoint_input.h"
#include "fuzz/harness.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/core/error.h"

namespace hetseq::fuzz {
namespace {

constexpr const char* kSource = "fuzz-input.pt";

/// A checkpoint the decoder accepted encodes, and encodes to the same bytes after another round trip: decoding
/// kept all that encode_checkpoint writes. Any exception here is a finding, an InputError included.
void check_round_trip(const Checkpoint& decoded) {
  const std::vector<char> encoded = encode_checkpoint(decoded);
  const std::vector<char> again = encode_checkpoint(decode_checkpoint(encoded, "re-encoded fuzz input"));
  HETSEQ_ASSERT(encoded == again, "a decoded checkpoint changed in an encode/decode round trip ({} vs {} bytes)",
                encoded.size(), again.size());
}

}  // namespace

Outcome run_input(const uint8_t* data, size_t size) {
  const std::vector<char> bytes = checkpoint_bytes_of_input(data, size);
  Checkpoint decoded;
  const Outcome outcome = run_expecting<InputError>([&] { decoded = decode_checkpoint(bytes, kSource); });
  HETSEQ_ASSERT(outcome.accepted || outcome.rejection.find(kSource) != std::string::npos,
                "the checkpoint decoder's error does not name the source {}: {}", kSource, outcome.rejection);
  if (outcome.accepted) check_round_trip(decoded);
  return outcome;
}

}  // namespace hetseq::fuzz
