#include "hetseq/checkpoint/shard_files.h"

#include <functional>
#include <regex>

#include "hetseq/core/format.h"

namespace hetseq {
namespace fs = std::filesystem;

namespace {

// The stem of a checkpoint's file name: checkpoint_last for checkpoint_last.pt.
std::string stem_of(const fs::path& checkpoint) { return checkpoint.stem().string(); }

}  // namespace

fs::path shard_file_path(const fs::path& checkpoint, const std::string& save_id, int64_t rank, int64_t world_size) {
  return checkpoint.parent_path() /
         fmt::format("{}.{}.shard-{}-of-{}.pt", stem_of(checkpoint), save_id, rank, world_size);
}

fs::path manifest_path(const fs::path& checkpoint, const std::string& save_id) {
  return checkpoint.parent_path() / fmt::format("{}.{}.manifest.json", stem_of(checkpoint), save_id);
}

namespace {

// Removes the shard files and manifests in `dir` ("<stem>.<save id>.shard-r-of-W.pt", "<stem>.<save
// id>.manifest.json") for which `doomed(stem, save_id)` holds; returns the removed files.
std::vector<fs::path> remove_shard_files(const fs::path& dir,
                                         const std::function<bool(const std::string&, const std::string&)>& doomed) {
  static const std::regex kName(R"((.+)\.([0-9a-f]{16})\.(shard-\d+-of-\d+\.pt|manifest\.json))");
  std::vector<fs::path> found, removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, kName) && doomed(m[1].str(), m[2].str())) found.push_back(entry.path());
  }
  for (const auto& p : found) {
    if (fs::remove(p, ec)) removed.push_back(p);
  }
  return removed;
}

}  // namespace

std::vector<fs::path> remove_shard_sets(const fs::path& checkpoint, const std::string& keep) {
  const fs::path dir = checkpoint.parent_path().empty() ? fs::path(".") : checkpoint.parent_path();
  const std::string stem = stem_of(checkpoint);
  return remove_shard_files(dir, [&](const std::string& s, const std::string& id) { return s == stem && id != keep; });
}

std::vector<fs::path> remove_orphan_shard_sets(const fs::path& dir) {
  return remove_shard_files(dir, [&](const std::string& stem, const std::string&) {
    return !fs::exists(dir / (stem + ".pt"));
  });
}

}  // namespace hetseq
