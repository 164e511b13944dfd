#include "hetseq/shard/optimizer_shards.h"

#include <zlib.h>

#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/pickle_scan.h"
#include "hetseq/checkpoint/torch_archive.h"
#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/test_hooks.h"

namespace hetseq {
namespace fs = std::filesystem;

// The shard file, in torch.save's format (Python reads it with torch.load(weights_only=True)):
//
//   format_version, kind ("hetseq optimizer shard"), save_id, rank, world_size,
//   first, numel            the elements [first, first + numel) of the flat parameter space
//   state {k: tensor}       optim::StatePiece::state: "param.{i}.step", "param.{i}.{buffer}" (1-D)
//
// It has no checksum entry of its own: the manifest's CRC-32 covers the whole file, and is checked
// before the file is unpickled (OptimizerShards::open, read_shard).

namespace {

constexpr int64_t kShardFormatVersion = 1;
constexpr const char* kShardKind = "hetseq optimizer shard";

using Dict = c10::impl::GenericDict;

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

std::string hex(uint32_t crc) { return fmt::format("{:08x}", crc); }

// The size and CRC-32 of a file, read a MiB at a time; nullopt when it cannot be opened.
std::optional<std::pair<int64_t, uint32_t>> size_and_crc(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::nullopt;
  std::vector<char> buffer(size_t{1} << 20);
  int64_t size = 0;
  uint32_t crc = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0) {
    crc = crc_update(crc, buffer.data(), n);
    size += static_cast<int64_t>(n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return std::nullopt;
  return std::make_pair(size, crc);
}

}  // namespace

std::string new_save_id() {
  std::random_device device;
  const uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ device();
  return fmt::format("{:016x}", id);
}

ShardFileEntry write_optimizer_shard(const optim::StatePiece& piece, const std::string& save_id, int64_t rank,
                                     int64_t world_size, const fs::path& path) {
  ShardFileEntry entry;
  entry.rank = rank;
  entry.first = piece.first;
  entry.numel = piece.numel;
  entry.file = path.filename().string();
  uint32_t crc = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  int64_t bytes = 0;
  write_file_atomically(path, [&](FileSink& sink) {
    detail::ArchiveTensors tensors;
    Dict root(c10::StringType::get(), c10::AnyType::get());
    root.insert("format_version", kShardFormatVersion);
    root.insert("kind", std::string(kShardKind));
    root.insert("save_id", save_id);
    root.insert("rank", rank);
    root.insert("world_size", world_size);
    root.insert("first", piece.first);
    root.insert("numel", piece.numel);
    c10::Dict<std::string, torch::Tensor> state;
    for (const auto& [k, v] : piece.state) state.insert(k, tensors.stage(v.detach()));
    root.insert("state", state);
    detail::write_archive(root, tensors, [&](const void* data, size_t n) {
      crc = crc_update(crc, data, n);
      bytes += static_cast<int64_t>(n);
      return sink.write(data, n);
    });
    detail::run_checkpoint_file_written_hook(path);  // a test's hold: Note [Test hooks]
  });
  entry.bytes = bytes;
  entry.crc32 = crc;
  return entry;
}

void write_manifest(const ShardManifest& m, const fs::path& path) {
  nlohmann::ordered_json j;
  j["format"] = "hetseq optimizer shards";
  j["format_version"] = ShardManifest::kFormatVersion;
  j["save_id"] = m.save_id;
  j["checkpoint"] = m.checkpoint;
  j["num_updates"] = m.num_updates;
  j["world_size"] = m.world_size;
  j["total_numel"] = m.total_numel;
  j["shards"] = nlohmann::ordered_json::array();
  for (const auto& s : m.shards) {
    j["shards"].push_back({{"rank", s.rank}, {"first", s.first}, {"numel", s.numel}, {"file", s.file},
                           {"bytes", s.bytes}, {"crc32", hex(s.crc32)}});
  }
  const std::string text = j.dump(1) + "\n";
  write_file_atomically(path, [&](FileSink& sink) {
    sink.write(text.data(), text.size());
    detail::run_checkpoint_file_written_hook(path);  // a test's hold: Note [Test hooks]
  });
}

ShardManifest read_manifest(const fs::path& path) {
  if (!fs::is_regular_file(path)) {
    throw InputError(fmt::format("{}: missing", path.string()));
  }
  const std::vector<char> bytes = read_file(path);
  auto fail = [&](const std::string& what) -> InputError {
    return InputError(fmt::format("{}: {}; it is not a hetseq shard manifest, or it is damaged", path.string(), what));
  };
  ShardManifest m;
  try {
    const auto j = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (j.at("format").get<std::string>() != "hetseq optimizer shards") throw fail("another format");
    if (j.at("format_version").get<int64_t>() != ShardManifest::kFormatVersion) {
      throw fail(fmt::format("format version {}, this hetseq reads {}", j.at("format_version").get<int64_t>(),
                             ShardManifest::kFormatVersion));
    }
    m.save_id = j.at("save_id").get<std::string>();
    m.checkpoint = j.at("checkpoint").get<std::string>();
    m.num_updates = j.at("num_updates").get<int64_t>();
    m.world_size = j.at("world_size").get<int64_t>();
    m.total_numel = j.at("total_numel").get<int64_t>();
    for (const auto& s : j.at("shards")) {
      ShardFileEntry e;
      e.rank = s.at("rank").get<int64_t>();
      e.first = s.at("first").get<int64_t>();
      e.numel = s.at("numel").get<int64_t>();
      e.file = s.at("file").get<std::string>();
      e.bytes = s.at("bytes").get<int64_t>();
      e.crc32 = static_cast<uint32_t>(std::stoul(s.at("crc32").get<std::string>(), nullptr, 16));
      m.shards.push_back(std::move(e));
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    throw fail(what);
  }
  // The shards are the ranks in order, covering the flat space exactly, each in its own file.
  int64_t next = 0;
  for (size_t r = 0; r < m.shards.size(); ++r) {
    const ShardFileEntry& e = m.shards[r];
    if (e.rank != static_cast<int64_t>(r) || e.first != next || e.numel < 0 || e.bytes < 0 ||
        e.file.empty() || e.file.find('/') != std::string::npos) {
      throw fail(fmt::format("shard {} (rank {}, elements [{}, {}), file '{}') does not follow shard {}", r, e.rank,
                             e.first, e.first + e.numel, e.file, r == 0 ? std::string("none") : std::to_string(r - 1)));
    }
    next += e.numel;
  }
  if (static_cast<int64_t>(m.shards.size()) != m.world_size || next != m.total_numel) {
    throw fail(fmt::format("{} shards of {} elements for {} ranks and {} elements", m.shards.size(), next,
                           m.world_size, m.total_numel));
  }
  return m;
}

OptimizerShards::OptimizerShards(fs::path checkpoint, fs::path manifest_file, ShardManifest manifest)
    : checkpoint_(std::move(checkpoint)), manifest_file_(std::move(manifest_file)), manifest_(std::move(manifest)) {}

std::shared_ptr<const OptimizerShards> OptimizerShards::open(const fs::path& checkpoint, const OptimizerShardsRef& ref,
                                                             int64_t num_updates) {
  const fs::path path = manifest_path(checkpoint, ref.save_id);
  if (!fs::is_regular_file(path)) {
    throw InputError(fmt::format("{}: missing: {} keeps its optimizer state in shard files that this manifest lists "
                                 "(save {}), so the checkpoint is incomplete; restore the file, resume from another "
                                 "checkpoint, or pass --reset-optimizer",
                                 path.string(), checkpoint.string(), ref.save_id));
  }
  ShardManifest m = read_manifest(path);
  if (m.save_id != ref.save_id || m.world_size != ref.world_size || m.num_updates != num_updates) {
    throw InputError(fmt::format("{}: from save {} ({} ranks, {} updates), but {} is save {} ({} ranks, {} updates): "
                                 "the manifest belongs to another run or checkpoint; restore this checkpoint's own "
                                 "manifest, or pass --reset-optimizer",
                                 path.string(), m.save_id, m.world_size, m.num_updates, checkpoint.string(),
                                 ref.save_id, ref.world_size, num_updates));
  }
  for (const ShardFileEntry& e : m.shards) {
    const fs::path file = checkpoint.parent_path() / e.file;
    const auto found = size_and_crc(file);
    if (!found) {
      throw InputError(fmt::format("{}: missing or unreadable: rank {}'s optimizer shard of {} (save {}, listed in "
                                   "{}), so the checkpoint is incomplete; restore the file, resume from another "
                                   "checkpoint, or pass --reset-optimizer",
                                   file.string(), e.rank, checkpoint.string(), ref.save_id, path.string()));
    }
    if (found->first != e.bytes || found->second != e.crc32) {
      throw InputError(fmt::format("{}: {} bytes with CRC-32 {}, but the manifest {} says {} bytes with CRC-32 {}: "
                                   "the optimizer shard is damaged or from another save; restore the file, resume "
                                   "from another checkpoint, or pass --reset-optimizer",
                                   file.string(), found->first, hex(found->second), path.string(), e.bytes,
                                   hex(e.crc32)));
    }
  }
  return std::shared_ptr<const OptimizerShards>(new OptimizerShards(checkpoint, path, std::move(m)));
}

std::map<std::string, torch::Tensor> OptimizerShards::read_shard(size_t rank) const {
  const ShardFileEntry& e = manifest_.shards[rank];
  const fs::path file = checkpoint_.parent_path() / e.file;
  const std::vector<char> bytes = read_file(file);
  auto fail = [&](const std::string& what) -> InputError {
    return InputError(fmt::format("{}: {}; restore the file, resume from another checkpoint, or pass "
                                  "--reset-optimizer",
                                  file.string(), what));
  };
  const uint32_t crc = crc_update(static_cast<uint32_t>(crc32(0L, Z_NULL, 0)), bytes.data(), bytes.size());
  if (static_cast<int64_t>(bytes.size()) != e.bytes || crc != e.crc32) {
    throw fail(fmt::format("{} bytes with CRC-32 {}, but the manifest {} says {} bytes with CRC-32 {}", bytes.size(),
                           hex(crc), manifest_file_.string(), e.bytes, hex(e.crc32)));
  }
  detail::LoadedArchive archive;
  try {
    archive = detail::load_archive(bytes);
  } catch (const std::exception& ex) {
    std::string what = ex.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    throw fail(fmt::format("cannot be read as an archive ({})", what));
  }
  if (!archive.damage.empty()) throw fail(fmt::format("its pickle is damaged: {}", archive.damage));
  if (!archive.value.isGenericDict()) throw fail("it does not hold a dict");
  const Dict root = archive.value.toGenericDict();
  auto integer = [&](const std::string& key) {
    const auto it = root.find(key);
    if (it == root.end() || !it->value().isInt()) throw fail(fmt::format("the entry '{}' is missing", key));
    return it->value().toInt();
  };
  const auto id = root.find("save_id");
  const std::string saved_id = id != root.end() && id->value().isString() ? id->value().toStringRef() : "";
  if (saved_id != manifest_.save_id || integer("rank") != e.rank || integer("world_size") != manifest_.world_size ||
      integer("first") != e.first || integer("numel") != e.numel) {
    throw fail(fmt::format("holds rank {} of {}'s elements [{}, {}) of save {}, but the manifest {} lists it as rank "
                           "{} of {}'s [{}, {}) of save {}",
                           integer("rank"), integer("world_size"), integer("first"),
                           integer("first") + integer("numel"), saved_id, manifest_file_.string(), e.rank,
                           manifest_.world_size, e.first, e.first + e.numel, manifest_.save_id));
  }
  const auto state = root.find("state");
  if (state == root.end() || !state->value().isGenericDict()) throw fail("the entry 'state' is missing");
  std::map<std::string, torch::Tensor> out;
  for (const auto& entry : state->value().toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) throw fail("the entry 'state' is not a dict of tensors");
    out[entry.key().toStringRef()] = entry.value().toTensor();
  }
  return out;
}

// The re-cut: the range [first, first + numel) of the new run, from the old shards that overlap it.
optim::StatePiece OptimizerShards::read_range(int64_t first, int64_t numel,
                                              const std::vector<int64_t>& param_numels) const {
  int64_t total = 0;
  std::vector<int64_t> starts;  // [param] its first element in the flat space
  for (int64_t n : param_numels) {
    starts.push_back(total);
    total += n;
  }
  if (total != manifest_.total_numel) {
    throw InputError(fmt::format("{}: the optimizer shards hold {} elements, but the model has {}",
                                 manifest_file_.string(), manifest_.total_numel, total));
  }
  const int64_t end = first + numel;
  optim::StatePiece piece;
  piece.first = first;
  piece.numel = numel;
  std::map<std::string, int64_t> filled;  // [key] elements copied into piece.state[key]
  for (size_t r = 0; r < manifest_.shards.size(); ++r) {
    const ShardFileEntry& e = manifest_.shards[r];
    const int64_t old_end = e.first + e.numel;
    if (e.numel == 0 || old_end <= first || e.first >= end) continue;
    const std::map<std::string, torch::Tensor> old = read_shard(r);  // one old shard in memory at a time
    for (size_t i = 0; i < param_numels.size(); ++i) {
      const int64_t p0 = starts[i], p1 = starts[i] + param_numels[i];
      const int64_t new0 = std::max(p0, first), new1 = std::min(p1, end);  // parameter i in the new range
      const int64_t old0 = std::max(p0, e.first), old1 = std::min(p1, old_end);  // and in the old shard
      const int64_t a = std::max(new0, old0), b = std::min(new1, old1);
      if (a >= b) continue;
      const std::string prefix = fmt::format("param.{}.", i);
      for (auto it = old.lower_bound(prefix); it != old.end() && it->first.rfind(prefix, 0) == 0; ++it) {
        const std::string& key = it->first;
        const torch::Tensor& t = it->second;
        if (key.compare(prefix.size(), std::string::npos, "step") == 0) {
          auto& step = piece.state[key];
          if (!step.defined() || t.item<int64_t>() > step.item<int64_t>()) step = t.clone();
          continue;
        }
        if (t.dim() != 1 || t.numel() != old1 - old0) {
          throw InputError(fmt::format("{}: '{}' has {} elements, but parameter {}'s part of the shard has {}",
                                       (checkpoint_.parent_path() / e.file).string(), key, t.numel(), i, old1 - old0));
        }
        auto& into = piece.state[key];
        if (!into.defined()) into = torch::zeros({new1 - new0}, t.options());
        into.narrow(0, a - new0, b - a).copy_(t.narrow(0, a - old0, b - a));
        filled[key] += b - a;
      }
    }
  }
  for (const auto& [key, t] : piece.state) {
    if (key.size() >= 5 && key.compare(key.size() - 5, 5, ".step") == 0) continue;
    if (filled[key] != t.numel()) {
      throw InputError(fmt::format("{}: the optimizer shards hold '{}' for {} of the {} elements that the range [{}, "
                                   "{}) needs: the shards do not fit together",
                                   manifest_file_.string(), key, filled[key], t.numel(), first, end));
    }
  }
  return piece;
}

}  // namespace hetseq
