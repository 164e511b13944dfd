#include "hetseq/world/rendezvous.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/core/logging.h"
#include "hetseq/world/init_method.h"
#include "hetseq/world/rendezvous_keys.h"
#include "hetseq/world/sealed_store.h"
#include "hetseq/world/store_socket.h"

namespace hetseq {
namespace {

std::string seconds(std::chrono::milliseconds t) {
  return fmt::format("{}", std::chrono::duration_cast<std::chrono::seconds>(t).count());
}

}  // namespace

void leave_rendezvous(const Rendezvous& joined, std::chrono::milliseconds timeout) {
  store_barrier(*joined.store, "finished", joined.rank, joined.world_size, timeout, "",
                BarrierReport{joined.report_interval, joined.address});
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
      // Note [The store's address]: listening on the address named, not on every interface.
      if (tcp.isServer) {
        tcp.masterListenFd = bind_store_socket(method.host, static_cast<uint16_t>(method.port),
                                               "--distributed-init-method " + options.init_method);
      }
      auto store = c10::make_intrusive<c10d::TCPStore>(method.host, tcp);
      if (tcp.isServer) {
        log::info("[rendezvous] store listening on {}:{}{}", method.host, store->getPort(),
                  options.secret ? ", its values sealed with the job's secret" : "");
      }
      // Rank 0 warns, whoever hosts the store (rank 0 itself, its node's launcher, torchrun's agent): once a job.
      if (out.rank == 0 && !options.secret && !is_loopback_host(method.host)) {
        log::warn("[rendezvous] the store on {}:{} takes connections from anyone who reaches that address: they can "
                  "read its keys, forge a peer's address or join as a rank; give every rank "
                  "--distributed-secret-file (hetseq-train --make-secret PATH writes one, docs/security.md)",
                  method.host, store->getPort());
      }
      out.address = fmt::format("tcp://{}:{}", method.host, store->getPort());  // port 0 read back
      raw = store;
    }
  } catch (const c10::Error& e) {
    throw InputError(fmt::format("rank {}: cannot open the rendezvous store at '{}': {}", out.rank, options.init_method,
                                 e.what_without_backtrace()));
  }
  // Note [Sealed store]: with the job's secret, every key below (the handshake's, Gloo's, the fence's) is sealed.
  if (options.secret) raw = c10::make_intrusive<SealedStore>(raw, options.secret->derive("store"), options.secret->source());
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
  // Rank 0 sealed the store and this rank has no secret (a plain generation starts 'g'): one line now, rather
  // than a wait for ranks that meet under another prefix.
  if (!options.secret && SealedStore::looks_sealed(generation)) {
    throw UsageError(fmt::format("rank {}: the rendezvous store at '{}' is sealed with the job's secret and this rank "
                                 "was given none: give every rank the same --distributed-secret-file (or {})",
                                 out.rank, options.init_method, kSecretFileEnv));
  }
  out.base_prefix = base;
  out.raw_store = raw;
  out.prefix = base + std::string(generation.begin(), generation.end());  // PrefixStore adds the "/"
  out.store = c10::make_intrusive<c10d::PrefixStore>(out.prefix, raw);
  out.file_path = method.kind == InitMethod::Kind::kFile ? method.path : std::string();
  if (method.kind == InitMethod::Kind::kFile) out.address = "file://" + method.path;
  out.report_interval = options.report_interval;

  // Claim the rank (Note [Rendezvous keys]).
  c10d::Store& store = *out.store;
  const RankClaim me = RankClaim::of_this_process(out.world_size);
  const int64_t n = claim_rank(store, out.rank, me);
  if (n > 1) {
    const std::optional<RankClaim> first = read_rank_claim(store, out.rank);
    const bool first_gone =
        !first || (first->host == me.host && ::kill(static_cast<pid_t>(first->pid), 0) != 0 && errno == ESRCH);
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
                            out.rank, first ? first->host : "?", first ? first->pid : 0L, me.host, me.pid);
    }
    // Wakes every rank waiting at the start barrier with this message.
    store.set(fmt::format("arrived/w{}/open", out.world_size), std::vector<uint8_t>(message.begin(), message.end()));
    throw InputError(fmt::format("rank {}: {}", out.rank, message));
  }
  log::info("[rendezvous] rank {} of {} joined via {}", out.rank, out.world_size, options.init_method);
  store_barrier(store, "arrived", out.rank, out.world_size, options.timeout,
                "; check that every node was started with the same --distributed-init-method and "
                "--distributed-world-size",
                BarrierReport{options.report_interval, out.address});
  return out;
}

}  // namespace hetseq
