#include "hetseq/train/checkpointer.h"

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/shard/sharded_save.h"

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
  // A collective under --zero-sharding full: the whole model, unit by unit, kept by rank 0 for its file.
  controller.sharding().collect_model(/*keep=*/options_.rank == 0);
  // A collective: every rank hands its part of the comm hook's state to rank 0, which writes it (Note
  // [PowerSGD in checkpoints]).
  std::optional<PowerSgdState> comm_hook_state = controller.gather_comm_hook_state();
  if (!options_.save.no_save_optimizer_state) {
    // A strategy that keeps the optimizer state in shards gives this rank's piece for its shard file.
    if (std::optional<optim::StatePiece> piece = controller.sharding().state_piece()) {
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

// A sharded save: the strategy's shard files (ShardedSave), then the checkpoint itself last, whose rename
// commits the save. See Note [Sharded optimizer state in checkpoints] (hetseq/shard/sharded_save.cpp).
void Checkpointer::save_sharded(Controller& controller, const SavePoint& point, IteratorPosition next,
                                const DataPlan& plan, std::optional<PowerSgdState> comm_hook_state,
                                const optim::StatePiece& piece) {
  HETSEQ_ASSERT(options_.fence, "a sharded checkpoint without the checkpoint fence");
  SaveFence& fence = *options_.fence;
  const int64_t id = controller.num_updates();
  std::vector<fs::path> files;
  if (options_.rank == 0) {
    files = manager_.files_for(point);
    manager_.record(point);
  }
  ShardedSave save = ShardedSave::announce(fence, id, options_.rank, options_.world_size, files);
  if (save.empty()) {
    fence.run(id, [] {});
    return;
  }
  if (options_.rank != 0) save.write_part(piece);
  auto write = [&] {
    save.write_sets(piece, files, controller.num_updates());
    Checkpoint checkpoint = snapshot(controller, next, plan);
    checkpoint.powersgd = std::move(comm_hook_state);
    checkpoint.optimizer_shards = save.ref();
    const auto removed = manager_.write(checkpoint, files);
    std::vector<std::string> names;
    for (const auto& f : files) names.push_back(f.filename().string());
    log::info("[checkpoint] saved {} in {} (epoch {}, {} updates{}; optimizer state in {} shard files per name, save "
              "{})",
              fmt::join(names, ", "), options_.save.save_dir, point.epoch, controller.num_updates(),
              manager_.best() ? fmt::format(", best {} {}", options_.save.best_checkpoint_metric, *manager_.best()) : "",
              options_.world_size, save.save_id());
    for (const auto& f : removed) log::info("[checkpoint] removed {} (retention flags)", f.string());
  };
  fence.run(id, write);
}

}  // namespace hetseq
