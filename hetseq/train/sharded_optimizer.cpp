#include "hetseq/train/sharded_optimizer.h"

#include <set>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/world/lost_peer.h"

namespace hetseq {

// Note [Sharded optimizer state]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --zero-sharding os each rank keeps optimizer state (Adam's two moments, SGD's momentum,
// Adadelta's two averages) for a shard of the parameters only, sized by its memory budget.
//
// The shards. Lay the parameters end to end, in their order, as one flat space of T elements. Rank r
// owns the contiguous range [first_r, first_r + numel_r); the boundaries are the budgets' cumulative
// shares of T, rounded to multiples of 16 elements (plan_shards), the last rank taking the rest, so
// the shards cover T exactly and budgets 1:1:2 give 1/4, 1/4, 1/2 within 16 elements. A parameter
// may straddle two (or more) ranks: each rank's shard is a list of 1-D views, one per parameter it
// touches, narrow()ed out of the parameter's own storage (shard_slices, slice_views). The optimizer
// is the ordinary one, built by the same factory over these views, so its buffers (zeros_like the
// views) have the shard's size: the memory saved is (1 - numel_r / T) of the state.
//
// The update. The reducer allreduces the full gradients as without sharding, and the Controller
// divides, measures the global norm, checks overflow and clips them on every rank as before: every
// rank holds the same reduced gradients, so the norm and the clip factor are the global ones with no
// further collective. The step then gives each view the same view of its parameter's gradient, runs
// the optimizer on the views (updating the parameters' storage in place) and gathers the shards to
// every rank (ShardGather, Note [Gathering uneven shards]).
//
// Exactness. Adam (with weight decay), SGD with momentum and Adadelta are elementwise: an element's
// new value and state depend only on that element's value, gradient and state, the learning rate and
// the update count, which every rank shares (a view is updated whenever its parameter has a gradient,
// so its count is the parameter's). The norm is computed from the same full gradients. So each
// element of a shard gets what the unsharded step gives it, in exact arithmetic. In floating point
// it is also bit for bit, because each element goes through the same sequence of rounded operations:
// the per-tensor and foreach CPU kernels apply the same scalar operations to each element whatever
// the tensor's length, and the fused Adam CPU kernel, whose vectorised body and scalar tail see
// different elements of a slice that starts mid-vector, was observed to give the same bits there
// too: tests/train/test_sharded_optimizer.cpp compares with torch::equal for fused and foreach Adam
// (weight decay, clipped gradients), SGD with momentum and Adadelta, with shard boundaries at
// multiples of 16 and at odd offsets (alignment 1), and tensors straddling ranks; the 3-process test
// compares hetseq-train's parameters after 30 updates. CUDA kernels are not tested here. The
// gather copies bits. Under --fp16/--bf16 the parameters stay float32 (autocast), so the sharded
// state is the whole of what the optimizer keeps; there are no separate master weights.
//
// Not done: os+grad (each rank keeping only its slice of the reduced gradients). The c10d-style
// reducer allreduces whole buckets into the parameters' .grad views, and the global norm and clip
// read every gradient; a reduce-scatter with uneven splits would need buckets cut at shard
// boundaries and a norm over partial sums, which this first step leaves out (issue 27). Checkpoints:
// see Note [Sharded optimizer state in checkpoints].

std::unique_ptr<ShardedOptimizer> ShardedOptimizer::create(std::vector<torch::Tensor> params,
                                                           const optim::OptimizerFactory& make,
                                                           c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                           ShardedOptimizerOptions options, Report report) {
  HETSEQ_ASSERT(group, "ShardedOptimizer without a process group");
  HETSEQ_ASSERT(!params.empty(), "ShardedOptimizer without parameters");
  const int64_t world = group->getSize();
  std::vector<int64_t> numels;  // [param]
  int64_t total = 0;
  for (const auto& p : params) {
    numels.push_back(p.numel());
    total += p.numel();
  }
  // [rank] budgets, exchanged on the parameters' device (NCCL wants CUDA tensors).
  const auto int_options = torch::TensorOptions().dtype(torch::kInt64).device(params[0].device());
  std::vector<torch::Tensor> input{torch::full({1}, options.budget_bytes, int_options)};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < world; ++r) output[0].push_back(torch::empty({1}, int_options));
  wait_for_peers(group->allgather(output, input), group->getRank(), world, "allgather of the memory budgets");
  std::vector<int64_t> budgets;
  for (const auto& b : output[0]) budgets.push_back(b.cpu().item<int64_t>());

  std::vector<ShardRange> plan = plan_shards(budgets, total, options.alignment);
  const ShardRange mine = plan[static_cast<size_t>(group->getRank())];
  std::vector<ShardSlice> slices = shard_slices(numels, mine);
  std::vector<torch::Tensor> views = slice_views(params, slices);
  std::unique_ptr<optim::Optimizer> shard = make(views);
  auto gather = std::make_unique<ShardGather>(group, std::move(plan), params, options.gather);
  return std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(std::move(params), std::move(slices), std::move(views),
                                                                std::move(shard), std::move(gather), std::move(group),
                                                                options.budget_bytes, std::move(report)));
}

ShardedOptimizer::ShardedOptimizer(std::vector<torch::Tensor> params, std::vector<ShardSlice> slices,
                                   std::vector<torch::Tensor> views, std::unique_ptr<optim::Optimizer> shard,
                                   std::unique_ptr<ShardGather> gather, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                   int64_t budget_bytes, Report report)
    : Optimizer(std::move(params), shard->lr()),
      slices_(std::move(slices)),
      views_(std::move(views)),
      shard_(std::move(shard)),
      gather_(std::move(gather)),
      group_(std::move(group)),
      budget_bytes_(budget_bytes),
      report_(std::move(report)) {}

void ShardedOptimizer::step() {
  torch::NoGradGuard no_grad;
  shard_->set_lr(lr());
  for (size_t k = 0; k < views_.size(); ++k) {
    const ShardSlice& s = slices_[k];
    const torch::Tensor& g = params()[s.param].grad();
    if (g.defined()) {
      views_[k].mutable_grad() = g.reshape({-1}).narrow(0, s.offset, s.numel);
    } else {
      views_[k].mutable_grad().reset();
    }
  }
  gathered_.clear();
  shard_->step();
  for (auto& v : views_) v.mutable_grad().reset();
  gather_->gather();
  if (!reported_) report_plan();
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, t] : shard_->state()) {
    const bool buffer = name.rfind("param.", 0) == 0 && name.size() >= 5 && name.substr(name.size() - 5) != ".step";
    if (buffer) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

// A collective at the end of the first step: every rank's figures to every rank.
void ShardedOptimizer::report_plan() {
  reported_ = true;
  const ShardRange mine = shard();
  const auto int_options = torch::TensorOptions().dtype(torch::kInt64).device(params()[0].device());
  const std::vector<int64_t> figures{static_cast<int64_t>(group_->getRank()), mine.first, mine.numel, state_bytes(),
                                     budget_bytes_};
  std::vector<torch::Tensor> input{torch::tensor(figures, torch::kInt64).to(int_options.device())};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < group_->getSize(); ++r) output[0].push_back(torch::empty({5}, int_options));
  wait_for_peers(group_->allgather(output, input), group_->getRank(), group_->getSize(),
                 "allgather of the optimizer shards' figures");
  std::vector<ShardReport> reports;  // [rank]
  for (const auto& t : output[0]) {
    const torch::Tensor c = t.cpu();
    const int64_t* v = c.data_ptr<int64_t>();
    reports.push_back(ShardReport{v[0], v[1], v[2], v[3], v[4]});
  }
  if (report_) report_(reports);
}

// Note [Sharded optimizer state in checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under --zero-sharding os no rank holds the whole optimizer state, at a save or at a resume. For a
// checkpoint name N.pt (checkpoint_last.pt, checkpoint_best.pt, checkpoint{E}.pt, checkpoint_{E}_{U}.pt)
// a save writes, in --save-dir:
//
//   N.<id>.shard-<r>-of-<W>.pt  rank r's state_piece(): "param.{i}.step" and "param.{i}.{buffer}" (1-D,
//                               parameter i's elements in the rank's range [first, first + numel) of the
//                               flat space), with save id, rank, W, first and numel (torch.save format)
//   N.<id>.manifest.json        save id, N, update count, W, total elements, and per rank: first, numel,
//                               the shard file's name, size and CRC-32
//   N.pt                        the whole model and every other entry as before; its optimizer state has
//                               lr, num_steps and num_params, and `shards` {save_id, world_size}
//
// <id> is 16 random hex digits drawn by rank 0 at each save. The order (Checkpointer::save_sharded):
// rank 0 picks the names and the id and shares them through the store (SaveFence::share); every rank
// but 0 writes its shard for the first name (write temp, fsync, rename, fsync the directory) and posts
// its entry, under a heartbeat of its own (SaveFence::write_part, Note [Lost writers]); inside the checkpoint fence (Note [Checkpoint fence]), under its
// heartbeat, rank 0 writes its own, collects every entry (SaveFence::collect), copies the shards for
// the other names, writes one manifest per name, and writes N.pt last. N.pt's rename is the commit: until it happens N.pt is the previous save's, whose
// shards and manifest carry the previous id in their names and were not touched, so a process killed at
// any point leaves the previous checkpoint loadable (only one rename can be atomic; that is why the id
// is in the names rather than a manifest of fixed name being renamed over the old one). Afterwards rank
// 0 removes every other shard set of the names it wrote (earlier saves, and what a killed save left);
// the retention flags remove a checkpoint's shard sets with it (CheckpointManager, remove_shard_sets),
// and at start rank 0 removes the sets whose N.pt is not there (remove_orphan_shard_sets: a save killed
// under a name never written again, such as an interval checkpoint's). The fence's store keys are per
// save point, not per update count (Note [Checkpoint fence]): fp16 can skip every update between two.
// A rank whose shard cannot be written posts its error, and every rank fails with it through the fence.
//
// Load (TrainSession::build_model, on every rank, before anything is written): N.pt names its save id;
// OptimizerShards::open reads N.<id>.manifest.json, checks that its save id, world size and update count
// are N.pt's and that every shard file exists with the listed size and CRC-32 (streamed, a MiB at a
// time), and stops with one line naming the manifest or the shard file otherwise (an input error: exit
// code 3). The optimizer then reads its range (StateSource::read_range): a ShardedOptimizer its own
// shard of the new plan, which may span several old shard files, read one at a time and cut to the
// overlaps; an unsharded optimizer the whole range. So a sharded checkpoint resumes on another world
// size, other budgets or --zero-sharding none, and an ordinary checkpoint (full-size buffers in N.pt,
// from none or from an older hetseq that gathered the shards) loads into os as before (load_state
// narrows it). Peak memory: at a save the rank's own shard (it is streamed from the live buffers); at a
// resume its new shard plus one old shard file. The ranks' resume check compares model, schedule and
// position; each rank's shard was checked against the manifest. gather_state() remains for tests.

void ShardedOptimizer::gather_state() {
  torch::NoGradGuard no_grad;
  gathered_.clear();
  const auto inner = shard_->state();
  // The buffer names, from this rank's views; every rank runs the same optimizer on views that step
  // together (a view steps when its parameter has a gradient), so the names agree once any has stepped.
  std::set<std::string> names;
  for (const auto& [key, t] : inner) {
    if (key.rfind("param.", 0) != 0) continue;
    const std::string rest = key.substr(key.find('.', 6) + 1);
    if (rest != "step") names.insert(rest);
  }
  const int64_t world = group_->getSize();
  std::vector<int64_t> counts{static_cast<int64_t>(names.size())};
  // [rank] how many buffer names: the same on every rank, or the shards cannot be gathered.
  std::vector<torch::Tensor> in{torch::tensor(counts, torch::kInt64).to(params()[0].device())};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int64_t r = 0; r < world; ++r) out[0].push_back(torch::empty({1}, in[0].options()));
  wait_for_peers(group_->allgather(out, in), gather_->rank(), world, "allgather of the optimizer buffers' count");
  for (int64_t r = 0; r < world; ++r) {
    if (out[0][static_cast<size_t>(r)].cpu().item<int64_t>() != counts[0]) {
      throw InputError(fmt::format("--zero-sharding os: rank {} holds {} optimizer buffers per parameter and rank {} "
                                   "holds {}, so the state cannot be gathered for a checkpoint (a rank whose shard "
                                   "never had a gradient?); use --no-save-optimizer-state",
                                   r, out[0][static_cast<size_t>(r)].cpu().item<int64_t>(), gather_->rank(),
                                   counts[0]));
    }
  }
  std::vector<int64_t> numels;
  for (const auto& p : params()) numels.push_back(p.numel());
  const auto value_options = params()[0].options().dtype(torch::kFloat32);
  std::map<std::string, torch::Tensor> full;  // [buffer name] flat over all parameters
  for (const auto& name : names) full[name] = torch::zeros({plan().back().first + plan().back().numel}, value_options);
  std::vector<int64_t> steps(params().size(), 0);  // [param]
  for (int64_t r = 0; r < world; ++r) {
    const ShardRange range = plan()[static_cast<size_t>(r)];
    const auto slices = shard_slices(numels, range);
    const auto n = static_cast<int64_t>(slices.size());
    // The rank's buffers side by side ([name][element of its shard]), then its views' update counts.
    torch::Tensor values = torch::zeros({static_cast<int64_t>(names.size()), range.numel}, value_options);
    torch::Tensor counts_of =
        torch::zeros({n}, torch::TensorOptions().dtype(torch::kInt64).device(params()[0].device()));
    if (r == gather_->rank()) {
      int64_t at = 0;
      for (int64_t k = 0; k < n; ++k) {
        const auto step = inner.find(fmt::format("param.{}.step", k));
        if (step != inner.end()) counts_of[k] = step->second.item<int64_t>();
        int64_t row = 0;
        for (const auto& name : names) {
          const auto b = inner.find(fmt::format("param.{}.{}", k, name));
          if (b != inner.end()) values[row].narrow(0, at, slices[k].numel).copy_(b->second.reshape({-1}));
          ++row;
        }
        at += slices[k].numel;
      }
    }
    std::vector<torch::Tensor> tensors{values, counts_of};
    for (auto& t : tensors) {
      std::vector<torch::Tensor> one{t};
      c10d::BroadcastOptions options;
      options.rootRank = r;
      wait_for_peers(group_->broadcast(one, options), gather_->rank(), world,
                     fmt::format("broadcast of rank {}'s optimizer shard", r));
    }
    int64_t row = 0;
    for (const auto& name : names) full[name].narrow(0, range.first, range.numel).copy_(values[row++]);
    const torch::Tensor c = counts_of.cpu();
    for (int64_t k = 0; k < n; ++k) steps[slices[k].param] = std::max(steps[slices[k].param], c[k].item<int64_t>());
  }
  gathered_["lr"] = torch::scalar_tensor(lr(), torch::kFloat64);
  gathered_["num_steps"] = torch::scalar_tensor(shard_->num_steps(), torch::kInt64);
  gathered_["num_params"] = torch::scalar_tensor(static_cast<int64_t>(params().size()), torch::kInt64);
  int64_t start = 0;
  for (size_t i = 0; i < params().size(); ++i) {
    if (steps[i] > 0) {
      gathered_[fmt::format("param.{}.step", i)] = torch::scalar_tensor(steps[i], torch::kInt64);
      for (const auto& name : names) {
        gathered_[fmt::format("param.{}.{}", i, name)] =
            full[name].narrow(0, start, numels[i]).view(params()[i].sizes()).to(params()[i].scalar_type());
      }
    }
    start += numels[i];
  }
}

std::map<std::string, torch::Tensor> ShardedOptimizer::state() const {
  if (!gathered_.empty()) return gathered_;
  std::map<std::string, torch::Tensor> out;
  out["lr"] = torch::scalar_tensor(lr(), torch::kFloat64);
  out["num_steps"] = torch::scalar_tensor(shard_->num_steps(), torch::kInt64);
  out["num_params"] = torch::scalar_tensor(static_cast<int64_t>(params().size()), torch::kInt64);
  return out;
}

std::optional<optim::StatePiece> ShardedOptimizer::state_piece() const {
  optim::StatePiece piece;
  piece.first = shard().first;
  piece.numel = shard().numel;
  // The shard optimizer's "param.{k}.*" (view k) become "param.{i}.*" of the parameter the view is in.
  for (const auto& [key, t] : shard_->state()) {
    if (key.rfind("param.", 0) != 0) continue;
    const size_t dot = key.find('.', 6);
    const auto k = static_cast<size_t>(std::stoll(key.substr(6, dot - 6)));
    HETSEQ_ASSERT(k < slices_.size(), "shard optimizer state names view {} of {}", k, slices_.size());
    piece.state[fmt::format("param.{}.{}", slices_[k].param, key.substr(dot + 1))] = t.reshape({-1});
  }
  return piece;
}

void ShardedOptimizer::load_state(const std::map<std::string, torch::Tensor>& scalars,
                                  const optim::StateSource& pieces) {
  const auto num_params = scalars.find("num_params");
  if (num_params == scalars.end() || num_params->second.item<int64_t>() != static_cast<int64_t>(params().size())) {
    throw InputError(fmt::format("optimizer state: {} parameters saved, the model has {}",
                                 num_params == scalars.end() ? std::string("no count of") :
                                                               std::to_string(num_params->second.item<int64_t>()),
                                 params().size()));
  }
  std::vector<int64_t> numels;  // [param]
  for (const auto& p : params()) numels.push_back(p.numel());
  const optim::StatePiece piece = pieces.read_range(shard().first, shard().numel, numels);
  std::map<std::string, torch::Tensor> mine;
  for (const auto& [key, t] : scalars) {
    if (key.rfind("param.", 0) != 0) mine[key] = t;
  }
  mine["num_params"] = torch::scalar_tensor(static_cast<int64_t>(views_.size()), torch::kInt64);
  // View k holds the elements of parameter slices_[k].param that lie in the shard: the piece's entries
  // of that parameter, which read_range cut to the same elements.
  for (size_t k = 0; k < slices_.size(); ++k) {
    const std::string prefix = fmt::format("param.{}.", slices_[k].param);
    for (auto it = piece.state.lower_bound(prefix); it != piece.state.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string rest = it->first.substr(prefix.size());
      HETSEQ_ASSERT(rest == "step" || it->second.numel() == slices_[k].numel,
                    "read_range gave {} {} elements for a view of {}", it->first, it->second.numel(),
                    slices_[k].numel);
      mine[fmt::format("param.{}.{}", k, rest)] = it->second;
    }
  }
  shard_->load_state(mine);
  set_lr(shard_->lr());
}

void ShardedOptimizer::load_state(const std::map<std::string, torch::Tensor>& state) {
  const auto num_params = state.find("num_params");
  if (num_params == state.end() || num_params->second.item<int64_t>() != static_cast<int64_t>(params().size())) {
    throw InputError(fmt::format("optimizer state: {} parameters saved, the model has {}",
                                 num_params == state.end() ? std::string("no count of") :
                                                             std::to_string(num_params->second.item<int64_t>()),
                                 params().size()));
  }
  // The shard optimizer's state: view k takes parameter slices_[k].param's entries, narrowed.
  std::map<std::string, torch::Tensor> mine;
  for (const auto& [key, t] : state) {
    if (key.rfind("param.", 0) == 0) continue;
    mine[key] = t;
  }
  mine["num_params"] = torch::scalar_tensor(static_cast<int64_t>(views_.size()), torch::kInt64);
  for (size_t k = 0; k < slices_.size(); ++k) {
    const ShardSlice& s = slices_[k];
    const std::string prefix = fmt::format("param.{}.", s.param);
    for (auto it = state.lower_bound(prefix); it != state.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string rest = it->first.substr(prefix.size());
      const std::string key = fmt::format("param.{}.{}", k, rest);
      if (rest == "step") {
        mine[key] = it->second;
      } else {
        if (it->second.numel() != params()[s.param].numel()) {
          throw InputError(fmt::format("optimizer state: {} has {} elements, parameter {} has {}", it->first,
                                       it->second.numel(), s.param, params()[s.param].numel()));
        }
        mine[key] = it->second.reshape({-1}).narrow(0, s.offset, s.numel).clone();
      }
    }
  }
  shard_->load_state(mine);
  set_lr(shard_->lr());
}

}  // namespace hetseq
