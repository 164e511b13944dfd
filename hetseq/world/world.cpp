#include "hetseq/world/world.h"

#include <algorithm>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include <torch/cuda.h>
#ifdef HETSEQ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/world/init_method.h"
#include "hetseq/world/launcher.h"
#include "hetseq/world/process_group.h"
#include "hetseq/world/store_socket.h"

namespace hetseq {
namespace {

std::atomic<bool> g_joined{false};  // a distributed World of this process has joined

[[noreturn]] void exit_at_once(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// Whether the flags and the environment make this worker one of several.
bool is_distributed(const WorldOptions& o, const std::map<std::string, std::string>& env) {
  if (o.world_size.value_or(1) > 1) return true;
  if (o.init_method == "env://" || (o.init_method.empty() && launched_by_torchrun(env))) {
    return env.count("WORLD_SIZE") != 0;
  }
  if (o.init_method.empty()) return env.count("SLURM_NTASKS") != 0 && env.at("SLURM_NTASKS") != "1";
  return false;
}

}  // namespace

// Note [Joining a world]
// ~~~~~~~~~~~~~~~~~~~~~~
// A worker joins in two steps. The constructor only reads: the flags and the environment (env:// as
// torchrun sets it, Slurm's variables) give the rank, the world size and the local rank, hence the
// device (local rank i uses CUDA device i), which is made current at once, before any process group
// or CUDA context exists, so that NCCL and every allocation land on this worker's GPU. The task and
// model are built next, on that device; join() then needs them only for the start handshake (model
// digest, compared flags, data plan). join() runs rendezvous (store and start barrier), handshake and
// process group; leave() runs the final barrier and exits at once, because Gloo's teardown has been
// seen to spin for minutes. Gloo is registered for CPU and, where LibTorch has CUDA, CUDA tensors, so
// that a GPU rank can train with CPU ranks over Gloo.
//
// Under torchrun (TORCHELASTIC_RUN_ID set) an empty --distributed-init-method means env://, and when
// the agent says TORCHELASTIC_USE_AGENT_STORE it already hosts the store at MASTER_ADDR:MASTER_PORT,
// so rank 0 connects to it as a client instead of trying to host one there. That store outlives a
// restart of the workers, so every key carries the attempt (Note [Rendezvous keys]).
int64_t cuda_device_for(std::optional<int64_t> local_rank, int64_t device_id, int64_t visible_devices) {
  if (local_rank) {
    if (*local_rank < visible_devices) return *local_rank;
    if (visible_devices == 1) return 0;
    throw UsageError(fmt::format(
        "local rank {} (from the launcher's environment) has no CUDA device: this process sees {}; give each "
        "node's workers all its devices, or each worker exactly one (e.g. srun --gpus-per-task=1)",
        *local_rank, visible_devices));
  }
  if (device_id < 0 || device_id >= visible_devices) {
    throw UsageError(fmt::format("--device-id {}: this process sees {} CUDA device(s) (numbered from 0)", device_id,
                                 visible_devices));
  }
  return device_id;
}

World::World(const WorldOptions& o)
    : timeout_(o.timeout),
      rendezvous_timeout_(o.rendezvous_timeout),
      checkpoint_timeout_(o.checkpoint_timeout),
      debug_collectives_(o.debug_collectives) {
  const auto environment = process_environment();
  distributed_ = is_distributed(o, environment);
  rendezvous_.init_method = o.init_method;
  if (rendezvous_.init_method.empty() && launched_by_torchrun(environment)) rendezvous_.init_method = "env://";
  rendezvous_.world_size = o.world_size;
  rendezvous_.rank = o.rank;
  rendezvous_.timeout = o.rendezvous_timeout;
  if (distributed_) {
    const InitMethod method = parse_init_method(rendezvous_.init_method, environment);
    const bool from_environment = method.kind == InitMethod::Kind::kEnv || method.kind == InitMethod::Kind::kSlurm;
    if (from_environment && !o.rank_given) rendezvous_.rank.reset();  // RANK / SLURM_PROCID say
    resolve_ranks(method, environment, rendezvous_.world_size, rendezvous_.rank, local_rank_);
    // torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT and says so (Note [Joining a world]).
    const auto agent = environment.find("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = agent != environment.end() && (agent->second == "True" || agent->second == "1");
    rendezvous_.store_hosted_elsewhere = environment.count(kStoreHostedEnv) != 0 || agent_store;
    if (method.kind != InitMethod::Kind::kFile) master_host_ = method.host;
    // Note [A job's secret]: from the flag, or from the environment a launcher passes to every rank.
    std::string secret_file = o.secret_file;
    std::string flag = "--distributed-secret-file";
    const auto env_secret = environment.find(kSecretFileEnv);
    if (secret_file.empty() && env_secret != environment.end() && !env_secret->second.empty()) {
      secret_file = env_secret->second;
      flag = std::string(kSecretFileEnv) + "=";
    }
    if (!secret_file.empty()) {
      rendezvous_.secret = std::make_shared<const JobSecret>(JobSecret::load(secret_file, flag));
      // Note [Gloo over TLS]: Gloo's pairs too, unless the ranks meet on this machine's loopback.
      if (method.kind == InitMethod::Kind::kFile || !is_loopback_host(method.host)) {
        tls_ = std::make_shared<const GlooTls>(*rendezvous_.secret);
        log::info("[process-group] Gloo's connections over TLS 1.3, both ends proving the job's key (derived from {})",
                  rendezvous_.secret->path());
      }
    }
  } else {
    rendezvous_.world_size = 1;
    rendezvous_.rank = 0;
  }
  rank_ = *rendezvous_.rank;
  world_size_ = *rendezvous_.world_size;
  if (!o.cpu && torch::cuda::is_available()) {
    const int64_t device_index =
        cuda_device_for(local_rank_, o.device_id, static_cast<int64_t>(torch::cuda::device_count()));
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index));
#ifdef HETSEQ_WITH_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
#endif
  }
  backend_ = !o.backend.empty() ? o.backend : (device_.is_cuda() ? "nccl" : "gloo");
}

std::vector<WorkerInfo> World::join(WorkerInfo mine) {
  mine.rank = rank_;
  mine.world_size = world_size_;
  if (!distributed_) return {mine};
  joined_ = rendezvous(rendezvous_);
  g_joined = true;
  auto infos = exchange_worker_info(*joined_->store, mine, rendezvous_timeout_);
  group_ = make_process_group(joined_->store, rank_, world_size_, group_options());
  return infos;
}

ProcessGroupOptions World::group_options() const {
  ProcessGroupOptions pg;
  pg.backend = backend_;
  pg.timeout = timeout_;
  pg.master_host = master_host_;
  pg.debug_collectives = debug_collectives_;
  pg.tls = tls_;
  return pg;
}

c10::intrusive_ptr<c10d::ProcessGroup> World::subgroup(const std::vector<int64_t>& ranks) {
  HETSEQ_ASSERT(joined_ && group_, "World::subgroup before join()");
  if (static_cast<int64_t>(ranks.size()) == world_size_) return group_;
  return kept_group(subgroups_, "subgroup", ranks, "");
}

c10::intrusive_ptr<c10d::ProcessGroup> World::kept_group(
    std::map<std::vector<int64_t>, c10::intrusive_ptr<c10d::ProcessGroup>>& kept_groups, const std::string& kind,
    const std::vector<int64_t>& ranks, const std::string& backend) {
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  HETSEQ_ASSERT(it != ranks.end() && std::is_sorted(ranks.begin(), ranks.end()),
                "World's {}: rank {} not among the ranks [{}]", kind, rank_, fmt::join(ranks, ","));
  auto& kept = kept_groups[ranks];
  if (!kept) kept = group_over(fmt::format("{}/{}", kind, fmt::join(ranks, ",")), it - ranks.begin(), ranks.size(), backend);
  return kept;
}

c10::intrusive_ptr<c10d::ProcessGroup> World::role_group(const std::string& role) {
  HETSEQ_ASSERT(joined_ && group_, "World::role_group before join()");
  auto& kept = role_groups_[role];
  if (!kept) kept = group_over(fmt::format("role/{}", role), rank_, static_cast<size_t>(world_size_));
  return kept;
}

c10::intrusive_ptr<c10d::ProcessGroup> World::host_group(const std::vector<int64_t>& ranks) {
  HETSEQ_ASSERT(joined_ && group_, "World::host_group before join()");
  if (backend_ == "gloo") return ranks.empty() ? group_ : subgroup(ranks);
  std::vector<int64_t> members = ranks;
  if (members.empty()) {
    for (int64_t r = 0; r < world_size_; ++r) members.push_back(r);
  }
  return kept_group(host_groups_, "host", members, "gloo");
}

c10::intrusive_ptr<c10d::ProcessGroup> World::group_over(const std::string& prefix, int64_t rank, size_t size,
                                                         const std::string& backend) const {
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, joined_->store);
  ProcessGroupOptions options = group_options();
  if (!backend.empty()) options.backend = backend;
  return make_process_group(store, rank, static_cast<int64_t>(size), options);
}

void World::leave(int exit_code) {
  if (!joined_) return;
  leave_rendezvous(*joined_, rendezvous_timeout_);
  exit_at_once(exit_code);
}

void World::finish() {
  if (joined_) leave_rendezvous(*joined_, rendezvous_timeout_);
}

void World::abandon(int exit_code) {
  if (g_joined) exit_at_once(exit_code);
}

}  // namespace hetseq
