#include "hetseq/world/init_method.h"

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/parse.h"

extern char** environ;

namespace hetseq {
namespace {

std::optional<std::string> lookup(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::string require(const std::map<std::string, std::string>& env, const std::string& key, const std::string& why) {
  auto v = lookup(env, key);
  if (!v) throw UsageError(fmt::format("{}: the environment variable {} is not set", why, key));
  return *v;
}

// The first host of a Slurm node list: "node[003-005,007],gpu01" -> "node003".
std::string first_slurm_host(const std::string& list) {
  const size_t bracket = list.find('[');
  const size_t comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return list.substr(0, comma);
  }
  const std::string prefix = list.substr(0, bracket);
  std::string first = list.substr(bracket + 1);
  first = first.substr(0, first.find_first_of(",-]"));
  return prefix + first;
}

void set_or_check(std::optional<int64_t>& target, int64_t value, const std::string& flag, const std::string& source) {
  if (target && *target != value) {
    throw UsageError(fmt::format("{} is {} but {} says {}; give one or make them agree", flag, *target, source, value));
  }
  target = value;
}

}  // namespace

bool launched_by_torchrun(const std::map<std::string, std::string>& env) {
  const auto it = env.find("TORCHELASTIC_RUN_ID");
  return it != env.end() && !it->second.empty();
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

InitMethod parse_init_method(const std::string& text, const std::map<std::string, std::string>& env) {
  InitMethod m;
  const std::string flag = "--distributed-init-method";
  auto parse_port = [&](const std::string& port_text, const std::string& where) {
    const int64_t port = parse_int(where, port_text);
    if (port < 0 || port > 65535) throw UsageError(fmt::format("{}: port {} is outside 0..65535", where, port));
    return static_cast<uint16_t>(port);
  };
  if (text.rfind("tcp://", 0) == 0) {
    m.kind = InitMethod::Kind::kTcp;
    const std::string rest = text.substr(6);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      throw UsageError(fmt::format("{}: '{}' has no HOST:PORT; write e.g. tcp://10.0.0.1:23456", flag, text));
    }
    m.host = rest.substr(0, colon);
    if (m.host.size() > 2 && m.host.front() == '[' && m.host.back() == ']') m.host = m.host.substr(1, m.host.size() - 2);
    m.port = parse_port(rest.substr(colon + 1), flag);
    return m;
  }
  if (text.rfind("file://", 0) == 0) {
    m.kind = InitMethod::Kind::kFile;
    m.path = text.substr(7);
    if (m.path.empty() || m.path.front() != '/') {
      throw UsageError(fmt::format("{}: '{}' needs an absolute path on a filesystem all nodes share, "
                                   "e.g. file:///home/me/hetseq-rendezvous",
                                   flag, text));
    }
    return m;
  }
  if (text == "env://") {
    m.kind = InitMethod::Kind::kEnv;
    m.host = require(env, "MASTER_ADDR", flag + " env://");
    m.port = parse_port(require(env, "MASTER_PORT", flag + " env://"), "MASTER_PORT");
    return m;
  }
  if (text.empty() && lookup(env, "SLURM_PROCID") && lookup(env, "SLURM_NTASKS")) {
    m.kind = InitMethod::Kind::kSlurm;
    m.host = lookup(env, "MASTER_ADDR").value_or(first_slurm_host(require(env, "SLURM_JOB_NODELIST", "Slurm")));
    m.port = parse_port(lookup(env, "MASTER_PORT").value_or("29500"), "MASTER_PORT");
    return m;
  }
  if (text.empty()) {
    throw UsageError(fmt::format("{} is needed for more than one rank: tcp://HOST:PORT, file:///shared/path or env://",
                                 flag));
  }
  throw UsageError(fmt::format("{}: '{}' is not tcp://HOST:PORT, file:///path or env://", flag, text));
}

void resolve_ranks(const InitMethod& method, const std::map<std::string, std::string>& env,
                   std::optional<int64_t>& world_size, std::optional<int64_t>& rank,
                   std::optional<int64_t>& local_rank) {
  if (method.kind == InitMethod::Kind::kEnv) {
    set_or_check(world_size, parse_int("WORLD_SIZE", require(env, "WORLD_SIZE", "env://")),
                 "--distributed-world-size", "WORLD_SIZE");
    set_or_check(rank, parse_int("RANK", require(env, "RANK", "env://")), "--distributed-rank", "RANK");
    if (auto lr = lookup(env, "LOCAL_RANK")) local_rank = parse_int("LOCAL_RANK", *lr);
  } else if (method.kind == InitMethod::Kind::kSlurm) {
    set_or_check(world_size, parse_int("SLURM_NTASKS", require(env, "SLURM_NTASKS", "Slurm")),
                 "--distributed-world-size", "SLURM_NTASKS");
    set_or_check(rank, parse_int("SLURM_PROCID", require(env, "SLURM_PROCID", "Slurm")), "--distributed-rank",
                 "SLURM_PROCID");
    if (auto lr = lookup(env, "SLURM_LOCALID")) local_rank = parse_int("SLURM_LOCALID", *lr);
  }
  if (!world_size || *world_size < 1) {
    throw UsageError("--distributed-world-size must be given (a positive number of ranks in all)");
  }
  if (!rank || *rank < 0 || *rank >= *world_size) {
    throw UsageError(fmt::format("--distributed-rank {} is outside 0..{} (--distributed-world-size {})",
                                 rank.value_or(-1), *world_size - 1, *world_size));
  }
}

}  // namespace hetseq
