#include "hetseq/train/checkpointer.h"

#include <exception>
#include <sstream>

#include "hetseq/checkpoint/atomic_file.h"
#include "hetseq/checkpoint/optimizer_shards.h"
#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"

namespace hetseq {
namespace fs = std::filesystem;

Checkpointer::Checkpointer(CheckpointerOptions options, std::optional<double> best)
    : options_(std::move(options)), manager_(options_.save) {
  manager_.set_best(best);
}

bool Checkpointer::due_after_update(int64_t num_updates) const { return manager_.save_due_after_update(num_updates); }

bool Checkpointer::due_after_epoch(int64_t epoch) const { return manager_.save_due_after_epoch(epoch); }

Checkpoint Checkpointer::snapshot(Controller& controller, IteratorPosition next, const DataPlan& plan) const {
  Checkpoint c;
  static_cast<TrainingState&>(c) = controller.state(!options_.save.no_save_optimizer_state);
  c.epoch = next.epoch;
  c.offset = next.offset;
  c.best = manager_.best();
  c.data_plan = SavedDataPlan{plan.batch_sizes, plan.update_freqs, plan.shares};
  c.task = options_.task;
  c.model_digest = options_.model_digest;
  c.options = options_.options;
  return c;
}

void Checkpointer::save(Controller& controller, const SavePoint& point, IteratorPosition next, const DataPlan& plan) {
  last_saved_ = controller.num_updates();
  // A collective: every rank hands its part of the comm hook's state to rank 0, which writes it (Note
  // [PowerSGD in checkpoints]).
  std::optional<PowerSgdState> comm_hook_state = controller.gather_comm_hook_state();
  if (!options_.save.no_save_optimizer_state) {
    if (std::optional<optim::StatePiece> piece = controller.optimizer().state_piece()) {
      save_sharded(controller, point, next, plan, std::move(comm_hook_state), *piece);
      return;
    }
  }
  auto write = [&] {
    if (options_.rank != 0) return;
    const auto files = manager_.files_for(point);
    manager_.record(point);
    if (files.empty()) return;
    Checkpoint checkpoint = snapshot(controller, next, plan);
    checkpoint.powersgd = std::move(comm_hook_state);
    const auto removed = manager_.write(checkpoint, files);
    std::vector<std::string> names;
    for (const auto& f : files) names.push_back(f.filename().string());
    log::info("[checkpoint] saved {} in {} (epoch {}, {} updates{})", fmt::join(names, ", "), options_.save.save_dir,
              point.epoch, controller.num_updates(),
              manager_.best() ? fmt::format(", best {} {}", options_.save.best_checkpoint_metric, *manager_.best()) : "");
    for (const auto& f : removed) log::info("[checkpoint] removed {} (retention flags)", f.string());
  };
  if (options_.fence) {
    options_.fence->run(controller.num_updates(), write);
  } else {
    write();
  }
}

// A sharded save; see Note [Sharded optimizer state in checkpoints] (hetseq/train/sharded_optimizer.cpp).
void Checkpointer::save_sharded(Controller& controller, const SavePoint& point, IteratorPosition next,
                                const DataPlan& plan, std::optional<PowerSgdState> comm_hook_state,
                                const optim::StatePiece& piece) {
  HETSEQ_ASSERT(options_.fence, "a sharded checkpoint without the checkpoint fence");
  SaveFence& fence = *options_.fence;
  const int64_t id = controller.num_updates();
  const int64_t rank = options_.rank, world = options_.world_size;
  // Rank 0 decides the files (the best metric is its own) and the save id; every rank learns them.
  std::vector<fs::path> files;
  std::string announce;
  if (rank == 0) {
    files = manager_.files_for(point);
    manager_.record(point);
    if (!files.empty()) announce = new_save_id() + " " + files.front().string();
  }
  announce = fence.share(id, announce);
  if (announce.empty()) {
    fence.run(id, [] {});
    return;
  }
  const size_t space = announce.find(' ');
  const std::string save_id = announce.substr(0, space);
  const fs::path first = announce.substr(space + 1);

  // 1. Every rank writes its own shard, for the first file's name; rank 0 inside the fence's run(), so
  // that its heartbeat covers that write too (the others wait in run() meanwhile, and give up after
  // --distributed-timeout without a beat).
  ShardFileEntry mine;
  auto write_mine = [&] {
    mine = write_optimizer_shard(piece, save_id, rank, world, shard_file_path(first, save_id, rank, world));
  };
  // The others beat a heartbeat of their own meanwhile, so that rank 0 tells one that died from one
  // that writes slowly (Note [Lost writers]).
  if (rank != 0) {
    fence.write_part(id, [&] {
      write_mine();
      return fmt::format("ok {} {} {} {} {}", mine.first, mine.numel, mine.bytes, mine.crc32, mine.file);
    });
  }

  // 2. Rank 0, once every shard is written: the copies for the other names, a manifest per name, and
  // the checkpoint itself last, whose rename commits the save.
  auto write = [&] {
    write_mine();
    std::vector<ShardFileEntry> shards{mine};  // [rank]
    const std::vector<std::string> records = fence.collect(id);
    for (int64_t r = 1; r < world; ++r) {
      const std::string& text = records[static_cast<size_t>(r)];
      if (text.rfind("ok ", 0) != 0) {
        throw InputError(fmt::format("rank {} could not write its optimizer shard: {}", r,
                                     text.rfind("error ", 0) == 0 ? text.substr(6) : text));
      }
      ShardFileEntry e;
      e.rank = r;
      std::istringstream in(text.substr(3));
      in >> e.first >> e.numel >> e.bytes >> e.crc32 >> e.file;
      HETSEQ_ASSERT(!in.fail(), "rank {}'s shard record '{}'", r, text);
      shards.push_back(e);
    }
    int64_t total = 0;
    for (const auto& e : shards) total += e.numel;
    for (const fs::path& file : files) {
      ShardManifest manifest{save_id, file.filename().string(), controller.num_updates(), world, total, shards};
      for (auto& e : manifest.shards) {
        const fs::path to = shard_file_path(file, save_id, e.rank, world);
        if (file != first) copy_file_atomically(first.parent_path() / e.file, to);
        e.file = to.filename().string();
      }
      write_manifest(manifest, manifest_path(file, save_id));
    }
    Checkpoint checkpoint = snapshot(controller, next, plan);
    checkpoint.powersgd = std::move(comm_hook_state);
    checkpoint.optimizer_shards = OptimizerShardsRef{save_id, world};
    const auto removed = manager_.write(checkpoint, files);
    std::vector<std::string> names;
    for (const auto& f : files) names.push_back(f.filename().string());
    log::info("[checkpoint] saved {} in {} (epoch {}, {} updates{}; optimizer state in {} shard files per name, save "
              "{})",
              fmt::join(names, ", "), options_.save.save_dir, point.epoch, controller.num_updates(),
              manager_.best() ? fmt::format(", best {} {}", options_.save.best_checkpoint_metric, *manager_.best()) : "",
              world, save_id);
    for (const auto& f : removed) log::info("[checkpoint] removed {} (retention flags)", f.string());
  };
  fence.run(id, write);
}

}  // namespace hetseq
