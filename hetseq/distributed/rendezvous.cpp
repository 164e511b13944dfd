#include "hetseq/distributed/rendezvous.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include <thread>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
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

void resolve_ranks(const InitMethod& method, const std::map<std::string, std::string>& env, RendezvousOptions& options,
                   std::optional<int64_t>& local_rank) {
  if (method.kind == InitMethod::Kind::kEnv) {
    set_or_check(options.world_size, parse_int("WORLD_SIZE", require(env, "WORLD_SIZE", "env://")),
                 "--distributed-world-size", "WORLD_SIZE");
    set_or_check(options.rank, parse_int("RANK", require(env, "RANK", "env://")), "--distributed-rank", "RANK");
    if (auto lr = lookup(env, "LOCAL_RANK")) local_rank = parse_int("LOCAL_RANK", *lr);
  } else if (method.kind == InitMethod::Kind::kSlurm) {
    set_or_check(options.world_size, parse_int("SLURM_NTASKS", require(env, "SLURM_NTASKS", "Slurm")),
                 "--distributed-world-size", "SLURM_NTASKS");
    set_or_check(options.rank, parse_int("SLURM_PROCID", require(env, "SLURM_PROCID", "Slurm")), "--distributed-rank",
                 "SLURM_PROCID");
    if (auto lr = lookup(env, "SLURM_LOCALID")) local_rank = parse_int("SLURM_LOCALID", *lr);
  }
  if (!options.world_size || *options.world_size < 1) {
    throw UsageError("--distributed-world-size must be given (a positive number of ranks in all)");
  }
  if (!options.rank || *options.rank < 0 || *options.rank >= *options.world_size) {
    throw UsageError(fmt::format("--distributed-rank {} is outside 0..{} (--distributed-world-size {})",
                                 options.rank.value_or(-1), *options.world_size - 1, *options.world_size));
  }
}

namespace {

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::string seconds(std::chrono::milliseconds t) {
  return fmt::format("{}", std::chrono::duration_cast<std::chrono::seconds>(t).count());
}

// The ranks among [0, world_size) that have not set `key_prefix/<rank>`.
std::vector<int64_t> missing_ranks(c10d::Store& store, const std::string& key_prefix, int64_t world_size) {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < world_size; ++r) {
    if (!store.check({fmt::format("{}/{}", key_prefix, r)})) missing.push_back(r);
  }
  return missing;
}

// "host pid W": who claimed a rank, and for which world size (Note [Rendezvous keys]).
struct Claim {
  std::string host;
  long pid = 0;
  int64_t world_size = 0;
};

std::optional<Claim> read_claim(c10d::Store& store, int64_t rank) {
  const std::string key = fmt::format("rank/{}/by/1", rank);
  if (!store.check({key})) return std::nullopt;
  const std::vector<uint8_t> bytes = store.get(key);
  Claim c;
  char host[256] = {};
  if (std::sscanf(std::string(bytes.begin(), bytes.end()).c_str(), "%255s %ld %" SCNd64, host, &c.pid,
                  &c.world_size) != 3) {
    return std::nullopt;
  }
  c.host = host;
  return c;
}

}  // namespace

// Note [Rendezvous keys]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every key of a run lives under one prefix, hetseq/<run>/<attempt>/<generation>/: <run> is torchrun's
// TORCHELASTIC_RUN_ID or Slurm's job and step, <attempt> torchrun's restart count or Slurm's requeue
// count (store_prefix), and <generation> a token that the first rank 0 of the round sets with
// compareSet under hetseq/<run>/<attempt>/generation and that every rank reads; rank 0 deletes it
// when the round ends cleanly. A store that outlives a round (torchrun's agent store, which also
// serves the rounds of an elastic membership change within one attempt; a Slurm job's reused port;
// a shared file) then never shows one round's keys to the next, Gloo's connection keys included.
// The process group, the start handshake and the checkpoint fence all use the prefixed store.
//
// Arrival (store_barrier): a rank claims its rank with add("rank/<r>", 1) and writes "host pid W" under
// "rank/<r>/by/<n>" for the n it got back, then counts itself in with add("<barrier>/w<W>/count", 1);
// the rank that brings the count to W sets "<barrier>/w<W>/open", on which every rank waits (one
// blocking wait, no polling). Keys carry the world size W, so that ranks started with different
// --distributed-world-size never complete each other's barrier. A rank that gets n > 1 is a second
// worker with that rank: it writes the message naming both claims into "arrived/w<W>/open", so that
// every waiting rank fails with it at once, and fails itself. With file://, a claim whose process is
// gone on this host means the file is an earlier run's, and the message says to delete it. On a
// timeout, the per-rank keys "<barrier>/w<W>/<r>" name the ranks missing and their claims name those
// that came for another world size.

std::string store_prefix(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* key) {
    auto it = env.find(key);
    return it == env.end() ? std::string() : it->second;
  };
  std::string run = get("TORCHELASTIC_RUN_ID");
  std::string attempt = get("TORCHELASTIC_RESTART_COUNT");
  if (run.empty() && !get("SLURM_JOB_ID").empty()) {
    run = "slurm-" + get("SLURM_JOB_ID") + (get("SLURM_STEP_ID").empty() ? "" : "." + get("SLURM_STEP_ID"));
    attempt = get("SLURM_RESTART_COUNT");
  }
  if (run.empty()) run = "run";
  if (attempt.empty()) attempt = "0";
  return fmt::format("hetseq/{}/{}/", run, attempt);
}

void store_barrier(c10d::Store& store, const std::string& name, int64_t rank, int64_t world_size,
                   std::chrono::milliseconds timeout, const std::string& what_to_check) {
  const std::string at = fmt::format("{}/w{}", name, world_size);
  store.set(fmt::format("{}/{}", at, rank), std::vector<uint8_t>{1});
  if (store.add(at + "/count", 1) == world_size) {
    // Only if no duplicate rank has left its message there already.
    const std::string ok = "ok";
    store.compareSet(at + "/open", {}, std::vector<uint8_t>(ok.begin(), ok.end()));
  }
  try {
    store.wait({at + "/open"}, timeout);
  } catch (const c10::Error&) {
    std::vector<int64_t> missing = missing_ranks(store, at, world_size);
    std::string others;  // ranks that did arrive, but for a world of another size
    for (int64_t r : missing) {
      const std::optional<Claim> c = read_claim(store, r);
      if (c && c->world_size != world_size) {
        others += fmt::format("; rank {} (host {} pid {}) was started with --distributed-world-size {}", r, c->host,
                              c->pid, c->world_size);
      }
    }
    throw PeerError(fmt::format("rank {}: rank(s) {} of {} {} within {} s{}{}", rank, fmt::join(missing, ", "),
                                world_size, name == "arrived" ? "never arrived" : "did not finish", seconds(timeout),
                                others, what_to_check));
  }
  const std::vector<uint8_t> verdict = store.get(at + "/open");
  const std::string text(verdict.begin(), verdict.end());
  if (text != "ok") throw InputError(fmt::format("rank {}: {}", rank, text));
}

void leave_rendezvous(const Rendezvous& joined, std::chrono::milliseconds timeout) {
  store_barrier(*joined.store, "finished", joined.rank, joined.world_size, timeout, "");
  if (joined.rank != 0) {
    if (joined.store->add("left/count", 1) == joined.world_size - 1) {
      joined.store->set("left/all", std::vector<uint8_t>{1});
    }
    return;
  }
  // Other ranks may still be waiting at the barrier: keep the store up until each has said it left.
  if (joined.world_size > 1) {
    try {
      joined.store->wait({"left/all"}, timeout);
    } catch (const c10::Error&) {
      throw PeerError(fmt::format("rank 0: ranks did not leave within {} s", seconds(timeout)));
    }
  }
  // Every other rank has left: the next round of the same attempt (an elastic agent's) gets a fresh
  // generation, and the store file can go, so that the same command can run again.
  joined.raw_store->deleteKey(joined.base_prefix + "generation");
  if (!joined.file_path.empty()) ::unlink(joined.file_path.c_str());
}

Rendezvous rendezvous(const RendezvousOptions& options) {
  HETSEQ_ASSERT(options.rank && options.world_size, "rendezvous() before resolve_ranks()");
  Rendezvous out;
  out.rank = *options.rank;
  out.world_size = *options.world_size;
  const auto environment = process_environment();
  const InitMethod method = parse_init_method(options.init_method, environment);
  c10::intrusive_ptr<c10d::Store> raw;
  try {
    if (method.kind == InitMethod::Kind::kFile) {
      raw = c10::make_intrusive<c10d::FileStore>(method.path, static_cast<int>(out.world_size));
      raw->setTimeout(options.timeout);
    } else {
      c10d::TCPStoreOptions tcp;
      tcp.port = method.port;
      tcp.isServer = out.rank == 0 && !options.store_hosted_elsewhere;
      tcp.numWorkers = std::nullopt;
      tcp.waitWorkers = false;
      tcp.timeout = options.timeout;
      auto store = c10::make_intrusive<c10d::TCPStore>(method.host, tcp);
      if (tcp.isServer) log::info("[rendezvous] store listening on {}:{}", method.host, store->getPort());
      raw = store;
    }
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("rank {}: cannot open the rendezvous store at '{}': {}", out.rank, options.init_method,
                                 e.what_without_backtrace()));
  }
  // The round's generation (Note [Rendezvous keys]): the first rank 0 to come sets it, every rank reads it.
  const std::string base = store_prefix(environment);
  try {
    if (out.rank == 0) {
      const std::string token = fmt::format("g{:x}-{:x}", static_cast<long>(::getpid()),
                                            std::chrono::steady_clock::now().time_since_epoch().count());
      raw->compareSet(base + "generation", {}, std::vector<uint8_t>(token.begin(), token.end()));
    }
    raw->wait({base + "generation"}, options.timeout);
  } catch (const c10::Error&) {
    throw PeerError(fmt::format("rank {}: rank 0 never arrived at '{}' within {} s; check that every node was started "
                                "with the same --distributed-init-method",
                                out.rank, options.init_method, seconds(options.timeout)));
  }
  const std::vector<uint8_t> generation = raw->get(base + "generation");
  out.base_prefix = base;
  out.raw_store = raw;
  out.prefix = base + std::string(generation.begin(), generation.end());  // PrefixStore adds the "/"
  out.store = c10::make_intrusive<c10d::PrefixStore>(out.prefix, raw);
  out.file_path = method.kind == InitMethod::Kind::kFile ? method.path : std::string();

  // Claim the rank (Note [Rendezvous keys]).
  c10d::Store& store = *out.store;
  const std::string claim_key = fmt::format("rank/{}", out.rank);
  const int64_t n = store.add(claim_key, 1);
  const std::string me = fmt::format("{} {} {}", this_host(), static_cast<long>(::getpid()), out.world_size);
  store.set(fmt::format("{}/by/{}", claim_key, n), std::vector<uint8_t>(me.begin(), me.end()));
  if (n > 1) {
    const std::optional<Claim> first = read_claim(store, out.rank);
    const bool first_gone = !first || (first->host == this_host() && ::kill(static_cast<pid_t>(first->pid), 0) != 0 &&
                                       errno == ESRCH);
    std::string message;
    if (method.kind == InitMethod::Kind::kFile && first_gone) {
      message = fmt::format("--distributed-init-method {}: the file holds the rendezvous of an earlier run (rank {} "
                            "already arrived there{}); delete {} or use a fresh path",
                            options.init_method, out.rank,
                            first ? fmt::format(", from host {} pid {}, which is gone", first->host, first->pid) : "",
                            method.path);
    } else {
      message = fmt::format("two workers were started as rank {}: host {} pid {} and host {} pid {}; give every "
                            "worker its own --distributed-rank (a node's first rank plus its local index)",
                            out.rank, first ? first->host : "?", first ? first->pid : 0L, this_host(),
                            static_cast<long>(::getpid()));
    }
    // Wakes every rank waiting at the start barrier with this message.
    store.set(fmt::format("arrived/w{}/open", out.world_size), std::vector<uint8_t>(message.begin(), message.end()));
    throw InputError(fmt::format("rank {}: {}", out.rank, message));
  }
  log::info("[rendezvous] rank {} of {} joined via {}", out.rank, out.world_size, options.init_method);
  store_barrier(store, "arrived", out.rank, out.world_size, options.timeout,
                "; check that every node was started with the same --distributed-init-method and "
                "--distributed-world-size");
  return out;
}

}  // namespace hetseq
