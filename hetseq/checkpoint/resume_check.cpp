#include "hetseq/checkpoint/resume_check.h"

#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"

namespace hetseq {

void check_checkpoint_fits(const Checkpoint& c, const std::string& task, const std::string& model_digest,
                           const std::string& source) {
  if (c.task != task) {
    throw InputError(fmt::format("{}: written by --task {}, but this run has --task {}; pass the right --task or "
                                 "another --restore-file",
                                 source, c.task, task));
  }
  if (c.model_digest != model_digest) {
    throw InputError(fmt::format("{}: its model has other parameters (names or shapes) than this run's model; check "
                                 "the model flags, or pass another --restore-file",
                                 source));
  }
}

std::string state_digest(const Checkpoint& c) {
  return fmt::format("{:08x} ({} updates, epoch {}, offset {})", detail::training_state_checksum(c), c.num_updates,
                     c.epoch, c.offset);
}

}  // namespace hetseq
