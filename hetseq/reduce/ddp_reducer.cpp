#include "hetseq/reduce/ddp_reducer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/reduce/bucket_hook.h"
#include "hetseq/reduce/comm_clock.h"
#include "hetseq/reduce/powersgd.h"
#include "hetseq/world/process_group.h"
#include "hetseq/observe/tracer.h"

namespace hetseq {

// Note [Bucketed reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// What is reduced: every parameter that requires a gradient, once (shared parameters are
// deduplicated), in the order of named_parameters(). See Note [Weighted averaging] for why the
// reduction is a plain SUM over ranks: the comm hook below allreduces with SUM and divides by
// nothing; the Controller divides by the global sample size afterwards.
//
// Bucket layout. Gradients are copied into flat buckets, one allreduce per bucket, so that a few
// large messages replace many small ones. Backward produces gradients roughly in the reverse of the
// order in which the parameters were registered, so the first layout walks the parameters from the
// last to the first and cuts a bucket whenever it reaches its cap
// (c10d::compute_bucket_assignment_by_size): bucket 0 holds the last parameters, the first ready.
// The first bucket's cap is min(1 MiB, --bucket-cap-mb), so that the network starts early; the
// others use --bucket-cap-mb (a parameter larger than the cap gets a bucket of its own). After the
// first reduced backward, c10d::Reducer records the order in which gradients actually arrived, and at
// the start of the second reduced backward (rebuild_buckets, called from before_backward) it cuts the
// buckets again along that order, as rank 0 saw it, broadcast to every rank. Whether rebuilt or not,
// every rank has the same bucket list, which is what lets the allreduces of different ranks match up.
//
// The layout is part of the numerics. With three or more ranks Gloo's ring allreduce adds the ranks'
// values of an element in an order that depends on where the element lies in its bucket (which chunk
// of the ring it falls in), and float addition is not associative: the same gradients summed in
// another layout differ in the last bits. (With two ranks a + b = b + a, so it never shows.) A run
// resumed from a checkpoint would reduce its first update in the first layout where the run never
// stopped used the rebuilt one. So checkpoints keep the layout in force (bucket_layout()) and a
// resumed run starts from it (DdpOptions::initial_buckets); its own rebuild after that first update
// finds the same arrival order and keeps it.
//
// Overlap. For the last micro-batch of an update, before_backward calls prepare_for_backward, which
// arms a post-hook on every parameter's gradient accumulator. When a gradient is final its hook copies
// it into its bucket; when a bucket is full and every bucket before it has started, its allreduce
// starts (asynchronously, on the backend's threads) while backward goes on computing the gradients of
// earlier layers. At the end of backward an autograd-engine callback waits for every bucket, copies
// the sums back into each parameter's .grad, and (with --find-unused-parameters) uses an allreduced
// "used" bitmap to leave gradients of parameters that no rank used untouched; finish_update then
// drops those gradients (see "Unused parameters" below). Earlier micro-batches of the update
// (gradient accumulation, HetSeq's no_sync) do not arm the hooks: they only accumulate into .grad,
// and the last backward reduces the total.
//
// Unused parameters. Without --find-unused-parameters every parameter must get a gradient in the last
// backward of an update: a bucket that never fills never starts its allreduce, the peers wait on it
// until the timeout, and this rank's finish_update throws naming the parameters. With it,
// prepare_for_backward walks the autograd graph from the loss and marks the parameters not in it as
// ready (zeros in their bucket slots) as soon as the first gradient arrives. At the end of backward
// the Reducer has allreduced a per-parameter "used" count over the ranks (use in any micro-batch of
// the update counts). A parameter used on some ranks gets the sum, with zeros from the others. One
// used on no rank keeps its .grad untouched by the Reducer, which after the Controller's in-place
// zero_grad() is a zero tensor, not the undefined gradient PyTorch's DDP leaves after
// zero_grad(set_to_none=True); Adam would then decay its moments, apply weight decay and count a
// step. So finish_update resets those gradients to undefined, and the optimizers, the gradient norm
// and clipping skip the parameter. The Reducer makes a gradient a bucket view again the next time
// the parameter is used (gradient_as_bucket_view).
//
// Buffers. With broadcast_buffers (the default, as in DDP), before_forward broadcasts every buffer of
// the model from rank 0 once per update, so that running statistics that each rank updates in its
// own forward passes start every update as rank 0's.


namespace {

// Why `layout` cannot be the bucket list of `n` parameters (every index once), or "" when it can.
std::string layout_problem(const std::vector<std::vector<int64_t>>& layout, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& bucket : layout) {
    if (bucket.empty()) return "an empty bucket";
    for (int64_t i : bucket) {
      if (i < 0 || static_cast<size_t>(i) >= n) return fmt::format("parameter {} of {}", i, n);
      if (seen[static_cast<size_t>(i)]++) return fmt::format("parameter {} twice", i);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!seen[i]) return fmt::format("parameter {} missing", i);
  }
  return "";
}

constexpr size_t kBroadcastBucketBytes = 250 * 1024 * 1024;  // as DDP's initial state broadcast

// What a model gives the reducer: each tensor once (shared parameters are deduplicated), in the order of
// named_parameters(), then buffers().
struct ReducedTensors {
  std::vector<torch::Tensor> params;       // [param] those that take a gradient: the reduced ones
  std::vector<std::string> param_names;    // [param] their qualified names
  std::vector<torch::Tensor> buffers;      // [buffer] detached, for broadcast_buffers
  std::vector<torch::Tensor> state;        // every parameter and buffer, detached: what rank 0 broadcasts
};

ReducedTensors reduced_tensors(torch::nn::Module& model) {
  ReducedTensors t;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    t.state.push_back(p.detach());
    if (!p.requires_grad()) continue;
    t.param_names.push_back(item.key());
    t.params.push_back(p);
  }
  for (const auto& b : model.buffers()) {
    if (!b.defined() || !seen.insert(b.unsafeGetTensorImpl()).second) continue;
    t.state.push_back(b.detach());
    t.buffers.push_back(b.detach());
  }
  return t;
}

// Every rank starts from rank 0's model: a collective check that the ranks' tensors match in shape, then
// rank 0's values broadcast over `state` in place.
void start_from_rank0(const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::vector<torch::Tensor>& state,
                      int64_t rank, int64_t world_size) {
  try {
    c10d::verify_params_across_processes(group, state, std::nullopt);
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("rank {} of {}: the model's parameters or buffers differ from rank 0's: {}", rank,
                                 world_size, e.what_without_backtrace()));
  }
  try {
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(group, state, kBroadcastBucketBytes, 0);
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {} of {}: broadcasting the model from rank 0 failed: {}", rank, world_size,
                                 e.what()));
  }
}

// The bucket caps of Note [Bucketed reduction], in bytes: --bucket-cap-mb, and the first bucket's.
struct BucketCaps {
  int64_t bytes = 0;
  int64_t first_bytes = 0;
};

BucketCaps bucket_caps(double cap_mb) {
  BucketCaps caps;
  caps.bytes = std::max<int64_t>(1, std::llround(cap_mb * 1024.0 * 1024.0));
  caps.first_bytes = std::min<int64_t>(caps.bytes, c10d::kDefaultFirstBucketBytes);
  return caps;
}

// The first layout of Note [Bucketed reduction], [bucket][index in params]: `saved` (a resumed run's) when it
// fits the parameters, otherwise (with a warning naming `rank` when one was given) the parameters from the
// last to the first, cut by size.
std::vector<std::vector<size_t>> first_bucket_layout(const std::vector<torch::Tensor>& params, BucketCaps caps,
                                                     const std::vector<std::vector<int64_t>>& saved, int64_t rank) {
  const size_t n = params.size();
  std::vector<torch::Tensor> reversed(params.rbegin(), params.rend());
  std::vector<int64_t> reversed_indices;  // [position in `reversed`] index in params
  for (size_t i = n; i-- > 0;) reversed_indices.push_back(static_cast<int64_t>(i));
  const std::vector<bool> dense(n, false);  // no parameter expects a sparse gradient
  std::vector<std::vector<size_t>> buckets = std::get<0>(c10d::compute_bucket_assignment_by_size(
      reversed, {static_cast<size_t>(caps.first_bytes), static_cast<size_t>(caps.bytes)}, dense, reversed_indices));
  if (saved.empty()) return buckets;
  if (const std::string why = layout_problem(saved, n); !why.empty()) {
    log::warn("[reducer] rank {}: the saved bucket layout does not fit this model ({}); using the default one", rank,
              why);
    return buckets;
  }
  buckets.clear();
  for (const auto& bucket : saved) buckets.emplace_back(bucket.begin(), bucket.end());
  return buckets;
}

// The bytes of the shared-memory segment's slots for `params` cut into `buckets` (Note [Buckets in shared
// memory]).
struct SlotBytes {
  // The largest bucket there can be: one of `buckets`, or a rebuilt one (at most the cap plus the tensor that
  // crossed it), never more than all parameters.
  size_t bound = 0;
  // Room for every bucket in its place, whatever the layout: all the parameters, and up to 63 bytes of alignment
  // per bucket (a bucket has a parameter at least).
  size_t in_place = 0;
};

SlotBytes slot_bytes(const std::vector<torch::Tensor>& params, const std::vector<std::vector<size_t>>& buckets,
                     int64_t cap_bytes) {
  auto bytes_of = [&](size_t i) { return static_cast<size_t>(params[i].numel()) * params[i].element_size(); };
  size_t total = 0, largest = 0, largest_bucket = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    total += bytes_of(i);
    largest = std::max(largest, bytes_of(i));
  }
  for (const auto& bucket : buckets) {
    size_t b = 0;
    for (auto i : bucket) b += bytes_of(static_cast<size_t>(i));
    largest_bucket = std::max(largest_bucket, b);
  }
  SlotBytes slots;
  slots.bound = std::min(total, std::max(largest_bucket, static_cast<size_t>(cap_bytes) + largest));
  slots.in_place = total + 64 * params.size();
  return slots;
}

}  // namespace

DistributedReducer::DistributedReducer(torch::nn::Module& model, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                       DdpOptions options)
    : group_(std::move(group)),
      options_(options),
      clock_(std::make_shared<detail::CommClock>()) {
  HETSEQ_ASSERT(group_, "DistributedReducer built without a process group");
  rank_ = group_->getRank();
  world_size_ = group_->getSize();
  ReducedTensors tensors = reduced_tensors(model);
  params_ = std::move(tensors.params);
  param_names_ = std::move(tensors.param_names);
  buffers_ = std::move(tensors.buffers);
  if (params_.empty()) {
    throw InputError(fmt::format("rank {}: the model has no parameter that takes a gradient; nothing to train", rank_));
  }
  start_from_rank0(group_, tensors.state, rank_, world_size_);
  // The buckets: Note [Bucketed reduction].
  const BucketCaps caps = bucket_caps(options_.bucket_cap_mb);
  std::vector<std::vector<size_t>> buckets = first_bucket_layout(params_, caps, options_.initial_buckets, rank_);
  num_buckets_ = static_cast<int64_t>(buckets.size());
  open_shared_memory(buckets, caps.bytes);
  build_c10d_reducer(std::move(buckets), caps.bytes, caps.first_bytes);
  register_bucket_hook();
  update_group_ = group_;
  log::debug("[reducer] rank {}: {} parameters in {} buckets (cap {} MiB, first bucket {} bytes), comm hook {}{}, {}",
             rank_, params_.size(), num_buckets_, options_.bucket_cap_mb, caps.first_bytes,
             to_string(options_.comm_hook),
             shm_ ? fmt::format(" through shared memory (slots of {} bytes)", shm_->max_bytes()) : "",
             options_.find_unused_parameters ? "finding unused parameters" : "every parameter used");
}

// --shared-memory-reduce (Note [Shared-memory reduction]): whether it can is the same on every rank (one model, one
// comm hook, all devices CPU or the flag is an error), so the collectives of try_create run on all or none.
void DistributedReducer::open_shared_memory(const std::vector<std::vector<size_t>>& buckets, int64_t cap_bytes) {
  const bool all_cpu =
      std::all_of(params_.begin(), params_.end(), [](const torch::Tensor& p) { return p.device().is_cpu(); });
  const std::string off_cpu_error = all_cpu ? "" : off_cpu_refusal();
  if (!shared_memory_wanted(all_cpu, off_cpu_error)) return;
  const SlotBytes slots = slot_bytes(params_, buckets, cap_bytes);
  // Named in the caller's words: Note [Options in the user's words].
  const Naming naming = options_.naming;
  const auto& shm_option = kSharedMemoryOption;
  std::string why;
  if (options_.shared_memory == SharedMemoryReduceMode::kOn) {
    shm_ = SharedMemoryReduce::try_create(*group_, slots.bound, options_.shared_memory_timeout, all_cpu, &why, nullptr,
                                          slots.in_place, naming);
    if (!shm_) throw UsageError(all_cpu ? fmt::format("{}: {}", shm_option.set_to(naming, "on"), why) : off_cpu_error);
  } else {
    bool segment_failed = false;
    shm_ = SharedMemoryReduce::try_create(*group_, slots.bound, options_.shared_memory_timeout, all_cpu, &why,
                                          &segment_failed, slots.in_place, naming);
    if (!shm_ && segment_failed) {
      // The ranks could share memory but the segment could not be made: a slower run the user should hear of.
      log::warn("[reducer] rank {}: the ranks of this machine cannot sum their gradients through shared memory "
                "({}); they go through the process group instead, which is slower. Make room in /dev/shm, or pass "
                "{} to choose that",
                rank_, why, shm_option.set_to(naming, "off"));
    } else if (!shm_) {
      log::debug("[reducer] rank {}: gradients through the process group: {}", rank_, why);
    }
  }
  if (shm_ && rank_ == 0) {
    log::info("[reducer] the {} ranks, all on this machine, sum their gradients through shared memory "
              "({}; {} bytes a slot)",
              world_size_, shm_option.name(naming), shm_->max_bytes());
  }
}

// --shared-memory-reduce on, refused for a rank with parameters off the CPU, in the caller's words.
std::string DistributedReducer::off_cpu_refusal() const {
  const Naming naming = options_.naming;
  const auto& shm_option = kSharedMemoryOption;
  const auto off_cpu =
      std::find_if(params_.begin(), params_.end(), [](const torch::Tensor& p) { return !p.device().is_cpu(); });
  return fmt::format("{}: rank {} has parameters on {}; it sums CPU gradients only: use {} or {}",
                     shm_option.set_to(naming, "on"), rank_, off_cpu->device().str(), shm_option.value(naming, "auto"),
                     shm_option.value(naming, "off"));
}

// Whether to try a shared-memory segment: --shared-memory-reduce on, or auto with comm hook none, with peers, in a
// group whose collectives are not checked. Throws hetseq::UsageError where on cannot be (`off_cpu_error` in a world
// of one, or a checked group).
bool DistributedReducer::shared_memory_wanted(bool all_cpu, const std::string& off_cpu_error) const {
  const auto shm_mode = options_.shared_memory;
  const Naming naming = options_.naming;
  const auto& shm_option = kSharedMemoryOption;
  // With peers the check is collective (try_create), so that a CPU rank beside a GPU rank gets the usage error too,
  // not a lost peer in the segment's collectives.
  if (shm_mode == SharedMemoryReduceMode::kOn && !all_cpu && world_size_ == 1) throw UsageError(off_cpu_error);
  // Note [Shared memory and --debug-collectives]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // --debug-collectives promises that every collective is checked across the ranks (operation, sizes, dtypes)
  // before it runs; its checks live in the process group (c10d's ProcessGroupWrapper). Buckets summed through
  // shared memory never reach the group, so no check would see them: ranks whose bucket lists differ would go
  // unnoticed exactly where the flag is meant to catch them. So a checked group keeps the buckets: with auto the
  // reducer takes the process group and says why once (rank 0); on, which asks for what cannot be checked, is a
  // usage error naming both flags. The same on every rank, since the group is checked on all or none. From
  // Python, the checked group is the one that TORCH_DISTRIBUTED_DEBUG=DETAIL makes.
  const bool checked = checks_collectives(group_);
  const std::string checks = naming == Naming::kPython ? "TORCH_DISTRIBUTED_DEBUG=DETAIL" : "--debug-collectives";
  if (checked && shm_mode == SharedMemoryReduceMode::kOn) {
    throw UsageError(fmt::format("{} cannot be combined with {}: gradient buckets summed through shared memory bypass "
                                 "the checks of every collective; pass {} or {} with {}, or leave {}",
                                 shm_option.set_to(naming, "on"), checks, shm_option.set_to(naming, "auto"),
                                 shm_option.value(naming, "off"), checks,
                                 naming == Naming::kPython ? "TORCH_DISTRIBUTED_DEBUG unset" : checks + " out"));
  }
  // A world of one (a torchrun job shrunk to one node) has nothing to sum.
  const bool wanted = world_size_ > 1 && (shm_mode == SharedMemoryReduceMode::kOn ||
                                          (shm_mode == SharedMemoryReduceMode::kAuto &&
                                           options_.comm_hook == CommHook::kNone));
  if (wanted && checked && rank_ == 0) {
    log::info("[reducer] {}: the gradient buckets go through the process group, where they are checked, not through "
              "shared memory ({})",
              checks, shm_option.set_to(naming, to_string(shm_mode)));
  }
  return wanted && !checked;
}

// LibTorch's c10d::Reducer over params_ in `buckets`, with the Logger it reports through; the shared-memory
// segment learns the layout (and again after a rebuild: before_backward).
void DistributedReducer::build_c10d_reducer(std::vector<std::vector<size_t>> buckets, int64_t cap_bytes,
                                            int64_t first_cap_bytes) {
  std::unordered_map<size_t, std::string> names;  // [param index] qualified name
  for (size_t i = 0; i < param_names_.size(); ++i) names[i] = param_names_[i];
  const std::vector<bool> dense(params_.size(), false);  // no parameter expects a sparse gradient
  reducer_ = std::make_shared<c10d::Reducer>(params_, std::move(buckets), group_, dense, cap_bytes,
                                             options_.find_unused_parameters,
                                             /*gradient_as_bucket_view=*/true, std::move(names), first_cap_bytes,
                                             /*skip_all_reduce_unused_params=*/false,
                                             /*use_python_reducer=*/false,
                                             /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  // The Reducer reports errors and unused-parameter changes through a Logger it expects to exist.
  logger_ = std::make_shared<c10d::Logger>(reducer_);
  reducer_->set_logger(logger_);
  if (shm_) shm_->set_bucket_layout(bucket_sizes());
}

// The comm hook that carries each bucket (--ddp-comm-hook, through shared memory where there is a segment), with
// PowerSGD's state under powersgd.
void DistributedReducer::register_bucket_hook() {
  if (options_.comm_hook == CommHook::kPowerSgd) {
    if (options_.find_unused_parameters) {
      // The Reducer's own allreduce of the used parameters would interleave with PowerSGD's chained
      // collectives in a different order on different ranks (Note [PowerSGD]).
      throw UsageError(
          "--ddp-comm-hook powersgd cannot be combined with --find-unused-parameters; use fp16 or bf16 instead");
    }
    powersgd_ = std::make_shared<PowerSgd>(group_, options_.powersgd);
  }
  // The hook runs only inside backward, while this reducer exists; samples_ is set for that backward.
  BucketHookOptions hook_options;
  hook_options.kind = options_.comm_hook;
  hook_options.sample_size = [this] { return samples_ ? samples_() : 1.0; };
  hook_options.powersgd = powersgd_;
  hook_options.shm = shm_;
  auto hook = make_bucket_hook(group_, clock_, std::move(hook_options));
  hook_ = hook.get();
  reducer_->register_comm_hook(std::move(hook));
}

DistributedReducer::~DistributedReducer() = default;

void DistributedReducer::before_backward(int64_t index, int64_t count, const torch::Tensor& loss,
                                         const SampleCount& samples) {
  HETSEQ_ASSERT(0 <= index && index < count, "micro-batch {} of {}", index, count);
  if (index != count - 1) return;  // accumulate locally; see Note [Bucketed reduction]
  try {
    if (reducer_->rebuild_buckets()) {
      const std::vector<int64_t> sizes = logger_->get_bucket_sizes();
      num_buckets_ = static_cast<int64_t>(sizes.size());
      log::debug("[reducer] rank {}: buckets rebuilt in gradient order: [{}] bytes", rank_, fmt::join(sizes, ", "));
      if (shm_) {
        // The new buckets take new places, which may overlap the old: a gradient still viewing an old bucket
        // there moves to memory of its own first (Note [Buckets in shared memory]).
        for (auto& p : params_) {
          torch::Tensor& grad = p.mutable_grad();
          if (grad.defined() && shm_->holds(grad.data_ptr())) grad = grad.clone();
        }
        shm_->set_bucket_layout(sizes);
      }
    }
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {} of {}: the previous gradient reduction did not finish: {}", rank_,
                                 world_size_, e.what_without_backtrace()));
  }
  clock_->reset();
  if (powersgd_) powersgd_->begin_update();
  samples_ = samples;
  reducer_->prepare_for_forward();
  reducer_->prepare_for_backward(options_.find_unused_parameters ? std::vector<torch::Tensor>{loss}
                                                                 : std::vector<torch::Tensor>{});
  armed_ = true;
}

void DistributedReducer::finish_update() {
  HETSEQ_ASSERT(armed_,
                "finish_update without before_backward for the update's last micro-batch (a Task::train_step must "
                "run its loss through the Backward it is given)");
  armed_ = false;
  timing_ = clock_->timing();
  samples_ = nullptr;  // the count was this update's
  if (timing_.buckets != num_buckets_) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) missing.push_back(param_names_[i]);
    }
    // hetseq.DistributedDataParallel has no find_unused_parameters: Note [Options in the user's words].
    const char* what_to_do =
        options_.naming == Naming::kPython
            ? "hetseq.DistributedDataParallel has no find_unused_parameters: every parameter that requires a "
              "gradient must get one in the last micro-batch of each update; freeze one that the model leaves "
              "unused (requires_grad=False)"
            : "Use --find-unused-parameters when the model leaves parameters unused";
    throw InputError(fmt::format(
        "rank {} of {}: only {} of {} gradient buckets were reduced: some parameters got no gradient in the last "
        "backward of this update (parameters without any gradient: [{}]). {}",
        rank_, world_size_, timing_.buckets, num_buckets_, fmt::join(missing, ", "), what_to_do));
  }
  if (options_.find_unused_parameters) forget_unused_gradients();
  if (tracer_ && timing_.buckets > 0) {
    std::lock_guard<std::mutex> lock(clock_->mutex);
    tracer_->add_span("comm_wait", kTrainTrack, clock_->last_launch, clock_->last_done);
  }
}

void DistributedReducer::set_tracer(std::shared_ptr<Tracer> tracer) {
  std::lock_guard<std::mutex> lock(clock_->mutex);
  tracer_ = tracer;
  clock_->tracer = std::move(tracer);
}

void DistributedReducer::forget_unused_gradients() {
  // See Note [Bucketed reduction], "Unused parameters": after backward the Reducer's used map holds,
  // per parameter, the number of ranks that used it in this update (all its micro-batches).
  const torch::Tensor used = reducer_->get_local_used_map_on_device().to(torch::kCPU, torch::kInt64);  // [param]
  HETSEQ_ASSERT(used.numel() == static_cast<int64_t>(params_.size()), "used map of {} entries for {} parameters",
                used.numel(), params_.size());
  const auto count = used.accessor<int64_t, 1>();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (count[static_cast<int64_t>(i)] == 0) params_[i].mutable_grad().reset();
  }
}

void broadcast_model_buffers(const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::vector<torch::Tensor>& buffers,
                             int64_t rank, int64_t world_size) {
  try {
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(group, buffers, kBroadcastBucketBytes, 0);
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {} of {}: broadcasting the model's {} buffers from rank 0 failed: {} (a peer "
                                 "died, fell behind past the process group's timeout, or reached a different "
                                 "collective)",
                                 rank, world_size, buffers.size(), e.what()));
  }
}

void DistributedReducer::before_forward() {
  if (!options_.broadcast_buffers || buffers_.empty()) return;  // the same model, so the same choice on every rank
  const TraceSpan span(tracer_.get(), "broadcast_buffers");
  broadcast_model_buffers(update_group_, buffers_, rank_, world_size_);
}

void DistributedReducer::set_members(const std::vector<int64_t>& members,
                                     c10::intrusive_ptr<c10d::ProcessGroup> group) {
  HETSEQ_ASSERT(sits_out_supported(), "set_members with find_unused_parameters or PowerSGD");
  HETSEQ_ASSERT(!members.empty() && members.front() == 0, "the ranks that take part must include rank 0");
  update_group_ = group ? std::move(group) : group_;
  hook_->set_group(update_group_);
  if (shm_) shm_->set_members(std::vector<int>(members.begin(), members.end()));
}

bool DistributedReducer::gradients_in_shared_memory() const {
  if (!shm_) return false;
  return std::all_of(params_.begin(), params_.end(),
                     [&](const torch::Tensor& p) { return p.grad().defined() && shm_->holds(p.grad().data_ptr()); });
}

std::vector<int64_t> DistributedReducer::bucket_sizes() const { return logger_->get_bucket_sizes(); }

std::vector<std::vector<int64_t>> DistributedReducer::bucket_layout() const {
  std::unordered_map<const c10::TensorImpl*, int64_t> index;  // [parameter] position in params_
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].unsafeGetTensorImpl()] = static_cast<int64_t>(i);
  std::vector<std::vector<int64_t>> layout;
  for (const c10d::GradBucket& bucket : reducer_->get_grad_buckets(/*return_zero_tensors=*/false)) {
    std::vector<int64_t> members;
    for (const at::Tensor& p : bucket.getParameters()) members.push_back(index.at(p.unsafeGetTensorImpl()));
    layout.push_back(std::move(members));
  }
  return layout;
}

std::optional<PowerSgdState> DistributedReducer::gather_comm_hook_state() {
  if (!powersgd_) return std::nullopt;
  return powersgd_->gather_state();
}

bool DistributedReducer::load_comm_hook_state(const std::optional<PowerSgdState>& state, const std::string& source) {
  if (!powersgd_) return false;
  if (!state) {
    log::info("[powersgd] {} holds no PowerSGD state (written without --ddp-comm-hook powersgd, or by an earlier "
              "hetseq): the error feedback starts from zero, and the {} uncompressed warm-up updates of "
              "--powersgd-start-update run again",
              source, options_.powersgd.start_update);
    return true;
  }
  powersgd_->load_state(*state, source);
  return true;
}

}  // namespace hetseq
