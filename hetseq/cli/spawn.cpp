#include "hetseq/cli/spawn.h"
#include "hetseq/cli/train_command.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include <torch/cuda.h>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/cli/per_rank_flags.h"
#include "hetseq/world/launcher.h"
#include "hetseq/world/init_method.h"
#include "hetseq/world/slurm_step.h"

namespace hetseq::cli {

// Note [Spawning under Slurm]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// HetSeq starts one process per node, which spawns a worker per GPU (--distributed-gpus G, by
// default the visible GPUs). Under Slurm (SLURM_PROCID and SLURM_NTASKS set, no
// --distributed-init-method) srun has already started the processes, and how many workers each one
// should be depends on how srun laid its tasks out over the nodes, which SLURM_STEP_TASKS_PER_NODE
// says ("4(x2)": 4 tasks on each of 2 nodes). The decision comes before the World reads the rank:
//  - Some node runs several tasks (srun --ntasks-per-node G, one task per GPU): every task is one
//    worker, even when it sees all of the node's GPUs: rank SLURM_PROCID of SLURM_NTASKS on device
//    SLURM_LOCALID (see World). Asking such a task for several workers (--distributed-gpus G > 1)
//    is an error.
//  - Every node runs one task (srun --ntasks-per-node 1, the HetSeq way): the task spawns its G
//    workers; the world is SLURM_NTASKS x G and task t's workers are ranks t x G .. t x G + G - 1.
//    They meet over tcp:// at MASTER_ADDR (else the first node of SLURM_JOB_NODELIST) and port
//    MASTER_PORT (else 29500), where the launcher of task 0 hosts the store. Every node must have
//    the same G (the same --gres), or the ranks do not add up and the rendezvous times out.
// The decision reads only what every task of the step shares (the layout and the flags), so all
// tasks decide alike. With one task in all (SLURM_NTASKS=1) Slurm adds nothing: the task is a
// single node as without Slurm. The batch script itself is not one of srun's tasks (it has no
// SLURM_STEP_TASKS_PER_NODE) but sees SLURM_PROCID=0 and the job's SLURM_NTASKS: as rank 0 it
// would wait for ranks that never come, so it stops at once and asks for srun.

namespace {

// A per-worker flag's values: one for all workers, or one each. Throws hetseq::UsageError naming `flag`.
std::vector<int64_t> per_worker(const char* flag, const std::vector<int64_t>& values, int64_t workers) {
  if (values.size() == 1) return std::vector<int64_t>(static_cast<size_t>(workers), values[0]);
  if (static_cast<int64_t>(values.size()) == workers) return values;
  throw UsageError(fmt::format("{}: {} values for the {} workers of this node (--distributed-gpus); give one value, "
                               "or one per worker",
                               flag, values.size(), workers));
}

// See Note [Spawning under Slurm]; `wanted` is --distributed-gpus or the visible GPUs, `gpus_given`
// whether --distributed-gpus said so.
SpawnPlan plan_under_slurm(const TrainOptions& o, const SlurmTask& task,
                           const std::map<std::string, std::string>& env, int64_t wanted, bool gpus_given) {
  const WorldOptions& d = o.distributed.world;
  SpawnPlan plan;
  if (task.tasks_per_node.empty()) {
    throw UsageError(fmt::format("Slurm job with SLURM_NTASKS={} tasks, but this process is not one of srun's tasks "
                                 "(SLURM_STEP_TASKS_PER_NODE is unset: hetseq-train run directly in the batch "
                                 "script?); start it with `srun hetseq-train ...`, or give --distributed-init-method",
                                 task.tasks));
  }
  if (!task.one_task_per_node()) {
    if (gpus_given && wanted > 1) {
      throw UsageError(fmt::format("--distributed-gpus {}: Slurm runs several tasks on a node "
                                   "(SLURM_STEP_TASKS_PER_NODE={}), and each task is one worker; drop "
                                   "--distributed-gpus for one worker per task, or run one task per node "
                                   "(srun --ntasks-per-node 1) to spawn {} workers per node",
                                   wanted, task.tasks_per_node_text, wanted));
    }
    return plan;  // one worker: the World reads rank, world size and device from Slurm
  }
  if (wanted == 1) return plan;
  plan.workers = wanted;
  plan.world_size = task.tasks * wanted;
  plan.first_rank = task.rank * wanted;
  const std::string source =
      fmt::format("SLURM_NTASKS={} tasks, one per node (SLURM_STEP_TASKS_PER_NODE={}), x {} workers each{}", task.tasks,
                  task.tasks_per_node_text, wanted, gpus_given ? " (--distributed-gpus)" : " (the visible GPUs)");
  if (d.world_size && *d.world_size != plan.world_size) {
    throw UsageError(fmt::format("--distributed-world-size {} but {} make {} ranks; drop the flag or make them agree",
                                 *d.world_size, source, plan.world_size));
  }
  if (d.rank_given && d.rank != plan.first_rank) {
    throw UsageError(fmt::format("--distributed-rank {} but task SLURM_PROCID={} of {} starts at rank {}; drop the "
                                 "flag or make them agree",
                                 d.rank, task.rank, source, plan.first_rank));
  }
  const InitMethod master = parse_init_method("", env);  // MASTER_ADDR / SLURM_JOB_NODELIST, MASTER_PORT
  plan.init_method = fmt::format("tcp://{}:{}", master.host, master.port);
  plan.host_store = task.rank == 0;
  return plan;
}

// Note [Port 0]
// ~~~~~~~~~~~~~
// tcp://HOST:0 lets the store's host pick a free port. Only the workers that this command starts can
// learn it: the launcher hosts the store and passes the port it got on to them (launch_workers). A rank
// started by another command (another node, or a second hetseq-train) would wait for a port it cannot
// know until --rendezvous-timeout, silently. So port 0 is refused at once, before any store exists, when
// the world holds ranks that this command does not start.
void check_random_port(const std::string& init_method, int64_t first_rank, int64_t workers, int64_t world_size) {
  if (init_method.rfind("tcp://", 0) != 0) return;
  const InitMethod m = parse_init_method(init_method, {});
  if (m.port != 0 || (first_rank == 0 && workers >= world_size)) return;
  throw UsageError(fmt::format(
      "--distributed-init-method {}: port 0 picks a random port that only the workers this command starts can "
      "learn, but this command starts rank(s) {}..{} of --distributed-world-size {}; give a fixed port that every "
      "node reaches (e.g. tcp://{}:29500), or start all {} workers from this command (--distributed-gpus {})",
      init_method, first_rank, first_rank + workers - 1, world_size, m.host, world_size, world_size));
}

}  // namespace

SpawnPlan plan_spawn(const TrainOptions& o, const std::map<std::string, std::string>& env, int64_t visible_devices) {
  const WorldOptions& d = o.distributed.world;
  SpawnPlan plan;
  if (launched_by_torchrun(env)) return plan;  // Note [Joining a world]
  if (o.distributed.no_spawn) {
    check_random_port(d.init_method, d.rank, 1, d.world_size.value_or(1));  // Note [Port 0]
    return plan;
  }
  const bool gpus_given = o.distributed.gpus.has_value();
  const int64_t wanted = gpus_given ? *o.distributed.gpus : (!o.common.cpu && visible_devices > 0 ? visible_devices : 1);
  if (d.init_method.empty()) {
    const std::optional<SlurmTask> task = slurm_task(env);
    if (task && task->tasks > 1) return plan_under_slurm(o, *task, env, wanted, gpus_given);
  }
  if (wanted == 1) {
    check_random_port(d.init_method, d.rank, 1, d.world_size.value_or(1));  // Note [Port 0]
    return plan;
  }
  plan.workers = wanted;
  plan.first_rank = d.rank;
  plan.world_size = d.world_size.value_or(d.rank + wanted);  // HetSeq's default: the world is this node's workers
  plan.init_method = d.init_method;
  if (plan.init_method.empty() && plan.world_size == wanted) {
    plan.init_method = "tcp://127.0.0.1:0";  // a single node: a private rendezvous on loopback
  } else if (plan.init_method.empty()) {
    throw UsageError("--distributed-init-method is needed when the world spans several nodes "
                     "(--distributed-world-size larger than this node's workers): tcp://HOST:PORT, "
                     "file:///shared/path or env://");
  }
  check_random_port(plan.init_method, plan.first_rank, plan.workers, plan.world_size);  // Note [Port 0]
  plan.host_store = plan.init_method.rfind("tcp://", 0) == 0 && d.rank == 0;
  return plan;
}

namespace {

// The CPU cores this process may run on: its affinity mask (Slurm's task/affinity and taskset narrow
// it to the task's CPUs), else all of the machine's.
int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
}

}  // namespace

std::vector<std::string> worker_command_line(const WorkerLaunchOptions& o, int64_t i, const std::string& init_method) {
  std::vector<std::string> out{o.argv.front()};
  for (size_t k = 1; k < o.argv.size(); ++k) {
    const std::string& a = o.argv[k];
    const std::string name = a.rfind("--", 0) == 0 ? a.substr(2, a.find('=') - 2) : std::string();
    if (a == "--distributed-no-spawn") continue;  // a switch: no value follows
    if (launcher_set_flags().count(name)) {
      if (a.find('=') == std::string::npos) ++k;  // skip its value too
      continue;
    }
    out.push_back(a);
  }
  out.insert(out.end(), {"--distributed-no-spawn", "--distributed-world-size", std::to_string(o.world_size),
                         "--distributed-rank", std::to_string(o.first_rank + i),
                         "--device-id", std::to_string(i), "--max-sentences",
                         std::to_string(o.batch_sizes[static_cast<size_t>(i)]), "--distributed-init-method",
                         init_method});
  if (!o.balance_caps.empty()) {
    out.insert(out.end(), {"--balance-cap", std::to_string(o.balance_caps[static_cast<size_t>(i)])});
  }
  if (o.intra_op_threads > 0) out.insert(out.end(), {"--intra-op-threads", std::to_string(o.intra_op_threads)});
  return out;
}

SpawnPlan plan_for_this_process(const TrainOptions& o) {
  const int64_t visible = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  return plan_spawn(o, process_environment(), visible);
}

int spawn_workers(const TrainOptions& o, int argc, const char* const argv[], const SpawnPlan& plan) {
  const int64_t workers = plan.workers;
  log::set_rank(plan.first_rank);  // one launcher logs: the one of rank 0
  log::enable_all_ranks(o.distributed.log_all_ranks);
  WorkerLaunchOptions flags;
  flags.argv = resolve_aliases(argc, argv);
  flags.first_rank = plan.first_rank;
  flags.world_size = plan.world_size;
  flags.batch_sizes = per_worker("--max-sentences", o.dataset.max_sentences, workers);
  if (!o.balance.caps.empty()) flags.balance_caps = per_worker("--balance-cap", o.balance.caps, workers);
  const bool on_cpu = o.common.cpu || !torch::cuda::is_available();
  const int64_t cores = usable_cores();
  flags.intra_op_threads = o.common.intra_op_threads > 0 ? o.common.intra_op_threads
                                                         : (on_cpu ? std::max<int64_t>(1, cores / workers) : 0);
  LaunchOptions launch;
  launch.num_workers = workers;
  launch.first_rank = plan.first_rank;
  launch.world_size = plan.world_size;
  launch.command_line = [flags](int64_t i, const std::string& init_method) {
    return worker_command_line(flags, i, init_method);
  };
  // On CPUs the workers may be forks of this process that run hetseq-train's entry point: Note [Forked
  // workers] (hetseq/world/launcher.cpp). CUDA does not survive a fork, so GPU workers start anew.
  if (on_cpu) {
    launch.run_worker = [](const std::vector<std::string>& args) { return train_main(args); };
  }
  if (plan.host_store) {
    const InitMethod m = parse_init_method(plan.init_method, {});
    launch.host_tcp_store = true;
    launch.store_host = m.host;
    launch.store_port = m.port;
  }
  launch.init_method = plan.init_method;
  launch.store_timeout = o.distributed.world.timeout;
  return launch_workers(launch);
}

}  // namespace hetseq::cli
