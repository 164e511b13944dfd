#include "hetseq/world/handshake.h"

#include <set>

#include <nlohmann/json.hpp>

#include "hetseq/core/error.h"

namespace hetseq {
namespace {

nlohmann::json to_json(const WorkerInfo& w) {
  return {{"rank", w.rank},
          {"world_size", w.world_size},
          {"host", w.host},
          {"device", w.device},
          {"task", w.task},
          {"num_params", w.num_params},
          {"model_digest", w.model_digest},
          {"compared", w.compared},
          {"batch_size", w.batch_size},
          {"update_freq", w.update_freq},
          {"valid_batch_size", w.valid_batch_size},
          {"balance_cap", w.balance_cap},
          {"memory_budget", w.memory_budget},
          {"memory_budget_is_free_memory", w.memory_budget_is_free_memory},
          {"activation_bytes", w.activation_bytes},
          {"memory_micro_batch", w.memory_micro_batch}};
}

WorkerInfo from_json(const nlohmann::json& j) {
  WorkerInfo w;
  w.rank = j.at("rank");
  w.world_size = j.at("world_size");
  w.host = j.at("host");
  w.device = j.at("device");
  w.task = j.at("task");
  w.num_params = j.at("num_params");
  w.model_digest = j.at("model_digest");
  w.compared = j.at("compared").get<std::map<std::string, std::string>>();
  w.batch_size = j.at("batch_size").get<std::vector<int64_t>>();
  w.update_freq = j.at("update_freq").get<std::vector<int64_t>>();
  w.valid_batch_size = j.at("valid_batch_size");
  w.balance_cap = j.at("balance_cap");
  w.memory_budget = j.at("memory_budget");
  w.memory_budget_is_free_memory = j.at("memory_budget_is_free_memory");
  w.activation_bytes = j.at("activation_bytes");
  w.memory_micro_batch = j.at("memory_micro_batch");
  return w;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// Note [Compared flags]
// ~~~~~~~~~~~~~~~~~~~~~
// Ranks that differ in a flag other than the per-rank ones (batch sizes, update-freq, device, rank,
// paths of logs and traces, ...: see per_rank_flags.h) would train apart without an error, or send
// their collectives out of step. So every parsed flag, the running task's included, is compared at
// start unless it is declared per-rank: a new flag is checked by default. The flags of tasks that do
// not run are not compared: they cannot change the run, and ranks whose programs know other tasks (a
// --user-dir library loaded on one node) train the same model. Some facts stand in for per-rank
// flags: the resolved backend for --cpu and --distributed-backend, each split's size for --data.
void check_compared(const WorkerInfo& ref, const WorkerInfo& w) {
  auto value_of = [](const WorkerInfo& x, const std::string& name) {
    const auto it = x.compared.find(name);
    return it == x.compared.end() ? std::string("(not set)") : it->second;
  };
  std::set<std::string> names;
  for (const auto& entry : ref.compared) names.insert(entry.first);
  for (const auto& entry : w.compared) names.insert(entry.first);
  for (const auto& name : names) {
    const std::string ours = value_of(ref, name), theirs = value_of(w, name);
    if (ours == theirs) continue;
    throw InputError(fmt::format("rank {} ({}) and rank {} ({}) disagree on {}: rank {} has '{}', rank {} has '{}'; "
                                 "start every rank with the same value",
                                 ref.rank, ref.host, w.rank, w.host, name, ref.rank, ours, w.rank, theirs));
  }
}

}  // namespace

std::string model_digest(const torch::nn::Module& model) {
  std::string text;
  for (const auto& p : model.named_parameters(true)) text += fmt::format("{}:{};", p.key(), fmt::join(p.value().sizes(), "x"));
  for (const auto& b : model.named_buffers(true)) text += fmt::format("{}:{};", b.key(), fmt::join(b.value().sizes(), "x"));
  return fmt::format("{:016x}", fnv1a(text));
}

std::vector<WorkerInfo> exchange_worker_info(c10d::Store& store, const WorkerInfo& mine,
                                             std::chrono::milliseconds timeout) {
  const std::string payload = to_json(mine).dump();
  store.set(fmt::format("hetseq/handshake/{}", mine.rank), std::vector<uint8_t>(payload.begin(), payload.end()));
  std::vector<WorkerInfo> all;
  for (int64_t r = 0; r < mine.world_size; ++r) {
    const std::string key = fmt::format("hetseq/handshake/{}", r);
    try {
      store.wait({key}, timeout);
    } catch (const c10::Error&) {
      throw PeerError(fmt::format("rank {}: rank {} never published its start information within {} s", mine.rank, r,
                                   std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
    }
    const auto bytes = store.get(key);
    all.push_back(from_json(nlohmann::json::parse(std::string(bytes.begin(), bytes.end()))));
  }
  const WorkerInfo& ref = all.front();
  for (const auto& w : all) {
    auto mismatch = [&](const std::string& what, const std::string& a, const std::string& b) {
      return InputError(fmt::format("rank {} ({}) and rank 0 ({}) disagree on {}: {} vs {}; start every node with the "
                                    "same {}",
                                    w.rank, w.host, ref.host, what, b, a, what));
    };
    if (w.world_size != ref.world_size) {
      throw mismatch("--distributed-world-size", std::to_string(ref.world_size), std::to_string(w.world_size));
    }
    if (w.task != ref.task) throw mismatch("--task", ref.task, w.task);
    if (w.num_params != ref.num_params || w.model_digest != ref.model_digest) {
      throw mismatch("model (parameter count and shapes)", fmt::format("{} parameters, digest {}", ref.num_params, ref.model_digest),
                     fmt::format("{} parameters, digest {}", w.num_params, w.model_digest));
    }
    check_compared(ref, w);
  }
  return all;
}

void check_ranks_agree(c10d::Store& store, int64_t rank, int64_t world_size, const std::string& key,
                       const std::string& value, const std::string& what, const std::string& hint,
                       std::chrono::milliseconds timeout) {
  store.set(fmt::format("hetseq/agree/{}/{}", key, rank), std::vector<uint8_t>(value.begin(), value.end()));
  std::vector<std::string> values;
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string k = fmt::format("hetseq/agree/{}/{}", key, r);
    try {
      store.wait({k}, timeout);
    } catch (const c10::Error&) {
      throw PeerError(fmt::format("rank {}: rank {} never reported its {} within {} s", rank, r, what,
                                   std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
    }
    const auto bytes = store.get(k);
    values.emplace_back(bytes.begin(), bytes.end());
  }
  std::vector<std::string> differ;
  for (int64_t r = 1; r < world_size; ++r) {
    if (values[static_cast<size_t>(r)] != values[0]) differ.push_back(fmt::format("rank {} has {}", r, values[static_cast<size_t>(r)]));
  }
  if (!differ.empty()) {
    throw InputError(fmt::format("rank {}: the ranks disagree on {}: rank 0 has {}, {}; {}", rank, what, values[0],
                                 fmt::join(differ, ", "), hint));
  }
}

}  // namespace hetseq
