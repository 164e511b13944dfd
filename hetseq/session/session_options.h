#pragma once
/// What one rank's training session is built from: one plain struct per concern, filled by hetseq-train
/// from its command line (hetseq/cli/train_options.h) or by a program of its own (hetseq::train,
/// hetseq/session/train.h). Installed: it names no c10d type.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hetseq/checkpoint/save_options.h"
#include "hetseq/reduce/ddp_options.h"
#include "hetseq/world/world_options.h"
#include "hetseq/shard/zero_sharding.h"
#include "hetseq/observe/log_format.h"
#include "hetseq/optim/registry.h"
#include "hetseq/train/gradient_clipping.h"
#include "hetseq/train/loss_scaler.h"
#include "hetseq/train/precision.h"

namespace hetseq {

struct CommonOptions {
  std::string task;
  uint64_t seed = 19940802;
  bool cpu = false;
  bool no_progress_bar = false;
  int64_t log_interval = 100;
  LogFormat log_format = LogFormat::kSimple;
  int64_t intra_op_threads = 0;  // 0: LibTorch's default
  /// --deterministic: deterministic cuDNN convolution algorithms (no autotuning) and cuBLAS workspaces of a
  /// fixed size, so that two runs on the same GPU, or a run and its resume, end bit-equal. Costs speed; no
  /// effect on the CPU, whose kernels already are. See Note [Deterministic GPU kernels] (session/train.cpp).
  bool deterministic = false;
  /// --cuda-graph: updates replayed from a CUDA graph (Note [CUDA-graph updates], train/controller.cpp).
  bool cuda_graph = false;
};

/// What CommonOptions sets for the whole process: LibTorch's intra-op threads and --deterministic. Call
/// before the first CUDA operation (cuBLAS reads its workspace setting when it starts); train() does.
void apply_to_process(const CommonOptions& common);

struct DatasetOptions {
  int64_t num_workers = 1;
  std::vector<int64_t> max_sentences;  // [local worker] or one value for all
  std::optional<int64_t> max_sentences_valid;
  int64_t required_batch_size_multiple = 1;
  std::string train_subset = "train";
  std::vector<std::string> valid_subsets{"valid"};
  int64_t validate_interval = 1;
  bool disable_validation = false;
  int64_t curriculum = 0;
};

struct OptimizationOptions {
  int64_t max_epoch = 0;   // 0: no limit
  int64_t max_update = 0;  // 0: no limit
  double clip_norm = kDefaultClipNorm;
  std::vector<int64_t> update_freq{1};  // [epoch] (the last value holds for later epochs)
  std::vector<double> lr{0.25};         // [epoch]
  double min_lr = -1;
  std::string optimizer = "adam";                        // --optimizer (see optim::optimizers())
  optim::OptimizerFactory make_optimizer;                // its flags, read and checked (empty: see train())
  std::string lr_scheduler = "PolynomialDecayScheduler";  // --lr_scheduler (see optim::lr_schedulers())
  optim::LrSchedulerFactory make_lr_scheduler;           // its flags, read and checked (empty: see train())

  /// Throws hetseq::UsageError naming the flag of an invalid value: a negative --clip-norm, an update
  /// frequency below 1, no or a negative learning rate. Called once, where the options come in: by
  /// read_optimization_options for hetseq-train, by hetseq::train for a program of its own.
  void validate() const;
};

/// HetSeq's distributed flags.
struct DistributedOptions {
  /// --distributed-world-size, --distributed-rank (of this node's first worker), --device-id (alias
  /// --local_rank), --cpu, --distributed-backend, --distributed-init-method, --distributed-timeout.
  WorldOptions world;
  std::optional<int64_t> gpus;        // --distributed-gpus: workers on this node (default: CUDA devices, or 1)
  bool no_spawn = false;              // --distributed-no-spawn
  /// --bucket-cap-mb, --find-unused-parameters, --broadcast-buffers, --ddp-comm-hook, --powersgd-rank,
  /// --powersgd-start-update: the gradient reducer's own options (the session adds the seed and a resumed
  /// bucket layout).
  DdpOptions ddp;
  bool fast_stat_sync = false;        // --fast-stat-sync: the statistics channel's one allreduce
  bool log_all_ranks = false;
  ZeroSharding zero_sharding = ZeroSharding::kNone;  // --zero-sharding (compared across ranks)
  /// --memory-budget in bytes (per rank; unset: the free memory, see free_memory_bytes).
  std::optional<int64_t> memory_budget_bytes;

  /// Throws hetseq::UsageError naming the flags of a combination the sharding cannot honour (--zero-sharding
  /// os+grad or full with a comm hook, --find-unused-parameters or --shared-memory-reduce on:
  /// ShardingPolicy::check_options); `ddp` checks its own values (DdpOptions::validate). Called once, where the
  /// options come in.
  void validate() const;
};

/// The Balancing flags. See Note [Balancing].
struct AutoBalanceOptions {
  bool auto_balance = false;       // --auto-balance
  int64_t interval = 10;           // --balance-interval
  double threshold = 0.03;         // --balance-threshold
  bool threshold_given = false;    // a given threshold is used as is, never widened to the noise
  std::vector<int64_t> caps;       // --balance-cap: [local worker] or one value for all (empty: none)
};

/// The flags that make a run visible besides its log lines. See Note [Tracing].
struct ObserveOptions {
  std::optional<std::string> trace_dir;           // --trace-dir: each rank's timeline
  int64_t trace_first = 1, trace_last = 100;      // --trace-updates A:B
  bool trace_ops = false;                         // --trace-ops: LibTorch's op-level profiler too
  int64_t step_profile_warmup = 0;                // --step-profile WARMUP,TIMED (TIMED 0: off);
  int64_t step_profile_timed = 0;                 // see Note [Step profile]
  std::optional<std::string> tensorboard_logdir;  // --tensorboard-logdir
  std::optional<std::string> json_log;            // --json-log FILE
};

struct CheckpointOptions {
  CheckpointSaveOptions save;
  std::string restore_file = "checkpoint_last.pt";  // a name in --save-dir, or a path
  bool restore_file_given = false;                  // a missing file is an error only when given
  bool reset_dataloader = false;
  bool reset_lr_scheduler = false;
  bool reset_meters = false;
  bool reset_optimizer = false;
  std::vector<std::pair<std::string, double>> optimizer_overrides;  // --optimizer-overrides
  std::optional<std::string> dump_sample_ids;                       // --dump-sample-ids DIR
};

/// --fp16, --bf16 and the loss scaling flags. See Note [Loss scaling].
struct MixedPrecisionOptions {
  Precision precision = Precision::kFloat32;
  LossScalerOptions scaler;             // used with --fp16
  std::optional<int64_t> scale_window;  // --fp16-scale-window (default: see default_scale_window)

  /// HetSeq's default window: 2^14 micro-batches over all ranks, i.e. 16384 / (sum over ranks of the
  /// micro-batches per update), at least 1.
  static int64_t default_scale_window(int64_t micro_batches_per_update);
};

/// Everything a session is built from but the task's own flags: what hetseq-train reads from its
/// command line.
struct TrainOptions {
  CommonOptions common;
  DatasetOptions dataset;
  OptimizationOptions optimization;
  DistributedOptions distributed;
  AutoBalanceOptions balance;
  ObserveOptions observe;
  CheckpointOptions checkpoint;
  MixedPrecisionOptions mixed_precision;
};

}  // namespace hetseq
