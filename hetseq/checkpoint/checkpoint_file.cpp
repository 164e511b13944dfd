#include "hetseq/checkpoint/checkpoint_file.h"

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/checkpoint_format.h"
#include "hetseq/checkpoint/training_state.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/test_hooks.h"

namespace hetseq {
namespace fs = std::filesystem;

void save_checkpoint(const Checkpoint& checkpoint, const std::vector<fs::path>& paths) {
  if (paths.empty()) return;
  write_file_atomically(paths.front(), [&](FileSink& sink) {
    encode_checkpoint(checkpoint, [&](const void* data, size_t n) { return sink.write(data, n); });
    detail::run_checkpoint_file_written_hook(paths.front());  // a test's hold: Note [Test hooks]
  });
  for (size_t i = 1; i < paths.size(); ++i) copy_file_atomically(paths.front(), paths[i]);
}

Checkpoint load_checkpoint(const fs::path& path) {
  if (!fs::is_regular_file(path)) {
    throw InputError(fmt::format("{}: no such checkpoint file; check the path", path.string()));
  }
  return decode_checkpoint(read_file(path), path.string());
}

void load_model(torch::nn::Module& model, const fs::path& path) {
  load_model_tensors(model, load_checkpoint(path).model, path.string());
}

}  // namespace hetseq
