#include "hetseq/checkpoint/checkpoint_manager.h"

#include <algorithm>
#include <regex>

#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/shard_files.h"
#include "hetseq/core/format.h"

namespace hetseq {
namespace fs = std::filesystem;

CheckpointManager::CheckpointManager(CheckpointSaveOptions options) : options_(std::move(options)) {}

bool CheckpointManager::save_due_after_update(int64_t num_updates) const {
  return !options_.no_save && options_.save_interval_updates > 0 && num_updates % options_.save_interval_updates == 0;
}

bool CheckpointManager::save_due_after_epoch(int64_t epoch) const {
  return !options_.no_save && epoch % options_.save_interval == 0;
}

bool CheckpointManager::is_better(double value) const {
  if (!best_) return true;
  return options_.maximize_best_checkpoint_metric ? value > *best_ : value < *best_;
}

std::vector<fs::path> CheckpointManager::files_for(const SavePoint& p) const {
  std::vector<fs::path> files;
  if (options_.no_save) return files;
  const fs::path dir(options_.save_dir);
  if (p.end_of_epoch && !options_.no_epoch_checkpoints && p.epoch % options_.save_interval == 0) {
    files.push_back(dir / fmt::format("checkpoint{}.pt", p.epoch));
  }
  if (!p.end_of_epoch && options_.save_interval_updates > 0 && p.num_updates % options_.save_interval_updates == 0) {
    files.push_back(dir / fmt::format("checkpoint_{}_{}.pt", p.epoch, p.num_updates));
  }
  if (p.metric && is_better(*p.metric)) files.push_back(dir / "checkpoint_best.pt");
  if (!options_.no_last_checkpoints) files.push_back(dir / "checkpoint_last.pt");
  return files;
}

void CheckpointManager::record(const SavePoint& p) {
  if (p.metric && is_better(*p.metric)) best_ = *p.metric;
}

std::vector<fs::path> CheckpointManager::write(const Checkpoint& checkpoint, const std::vector<fs::path>& files) {
  save_checkpoint(checkpoint, files);
  // The shard sets of earlier saves under these names (or of a save killed before its checkpoint was
  // renamed) are no longer referenced: see Note [Sharded optimizer state in checkpoints].
  for (const auto& f : files) remove_shard_sets(f, checkpoint.optimizer_shards ? checkpoint.optimizer_shards->save_id : "");
  return prune();
}

std::vector<fs::path> CheckpointManager::prune() const {
  // [(sort key, path)] of the files of each kind, newest first.
  std::vector<std::pair<int64_t, fs::path>> interval, epochs;
  static const std::regex kInterval(R"(checkpoint_(\d+)_(\d+)\.pt)");
  static const std::regex kEpoch(R"(checkpoint(\d+)\.pt)");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.save_dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, kInterval)) interval.emplace_back(std::stoll(m[2]), entry.path());
    if (std::regex_match(name, m, kEpoch)) epochs.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::vector<fs::path> removed;
  auto keep_newest = [&](std::vector<std::pair<int64_t, fs::path>>& files, int64_t keep) {
    if (keep < 0 || static_cast<int64_t>(files.size()) <= keep) return;
    std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = static_cast<size_t>(keep); i < files.size(); ++i) {
      if (fs::remove(files[i].second, ec)) removed.push_back(files[i].second);
      for (auto& shard : remove_shard_sets(files[i].second)) removed.push_back(std::move(shard));
    }
  };
  keep_newest(interval, options_.keep_interval_updates);
  keep_newest(epochs, options_.keep_last_epochs);
  return removed;
}

}  // namespace hetseq
