#include "support/rank_processes.h"

#include <csignal>
#include <cstdlib>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "hetseq/world/process_group.h"

namespace hetseq::test {
namespace {

constexpr const char* kRankEnv = "HETSEQ_TEST_RANK";
constexpr const char* kWorldEnv = "HETSEQ_TEST_WORLD";
constexpr const char* kDirEnv = "HETSEQ_TEST_RANK_DIR";

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    throw std::runtime_error(std::string("rank_process(): ") + name +
                             " is not set: this test case runs as a rank of run_rank_processes()");
  }
  return value;
}

}  // namespace

std::vector<ProcessResult> run_rank_processes(const std::string& test_name, int world, const std::string& dir,
                                              std::chrono::seconds deadline,
                                              const std::map<std::string, std::string>& env) {
  std::vector<std::vector<std::string>> commands;
  std::vector<std::map<std::string, std::string>> envs;
  for (int r = 0; r < world; ++r) {
    commands.push_back({binary_path("hetseq-tests"), test_name});
    auto e = env;
    e[kRankEnv] = std::to_string(r);
    e[kWorldEnv] = std::to_string(world);
    e[kDirEnv] = dir;
    envs.push_back(std::move(e));
  }
  return run_processes(commands, deadline, envs, std::chrono::seconds(15));
}

RankProcess rank_process() {
  std::signal(SIGPIPE, SIG_IGN);  // as in rank_threads.cpp: a peer's closed socket fails the collective instead
  RankProcess p;
  p.rank = std::stoi(required_env(kRankEnv));
  p.world = std::stoi(required_env(kWorldEnv));
  p.dir = required_env(kDirEnv);
  auto store = c10::make_intrusive<c10d::FileStore>(p.dir + "/rendezvous", p.world);
  hetseq::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(10);
  p.group = hetseq::make_process_group(store, p.rank, p.world, options);
  return p;
}

}  // namespace hetseq::test
