#pragma once
// Whether a checkpoint fits the run that resumes from it, and the digest that the resumed ranks
// compare to see that they restored the same state.

#include <string>

#include "hetseq/checkpoint/checkpoint.h"

namespace hetseq {

/// Throws hetseq::InputError naming `source` when the checkpoint was written by another task or for
/// a model of other parameter names or shapes.
void check_checkpoint_fits(const Checkpoint& checkpoint, const std::string& task, const std::string& model_digest,
                           const std::string& source);

/// A digest of the training state (model, optimizer, LR scheduler, update count and position; not the
/// meters or RNG), as readable text: ranks that resumed compare it (see check_ranks_agree).
std::string state_digest(const Checkpoint& checkpoint);

}  // namespace hetseq
