#include "hetseq/world/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>
#ifdef HETSEQ_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/cuda.h>
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include "hetseq/core/error.h"
#include "hetseq/core/logging.h"
#include "hetseq/world/gloo_tls.h"

namespace hetseq {
namespace {

// The local address this machine uses to reach `host` (a UDP "connect" sends nothing), or "" when it
// cannot be found.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "";
  std::string out;
  const int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr = local.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                                                    : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

// Gloo's transport device: the interface GLOO_SOCKET_IFNAME names, else the local address that
// routes to the rendezvous host, else Gloo's default (this host name's address).
// With `tls`, the same place on Gloo's TCP_TLS transport (Note [Gloo over TLS]).
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_host, const GlooTls* tls) {
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
    return tls ? tls->device("", iface) : c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  }
  if (!master_host.empty()) {
    const std::string local = local_address_towards(master_host);
    if (!local.empty()) {
      log::debug("[process-group] gloo on {} (towards {}){}", local, master_host, tls ? " over TLS" : "");
      return tls ? tls->device(local, "") : c10d::ProcessGroupGloo::createDeviceForHostname(local);
    }
  }
  if (tls) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    return tls->device(host, "");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

// Note [Flight recorder off]
// LibTorch records every Gloo and NCCL collective in a process-wide ring ("flight recorder", 2000
// entries by default) meant for Python's dump tools, capturing a traceback each time. hetseq reads
// none of it, and its first record for each process group writes a shared map before taking the
// recorder's lock, so two threads starting their first collectives at once (two ranks in one test
// process; on a GPU, an autograd device thread's reduction beside the main thread's statistics)
// can corrupt the map and crash. Off unless asked for, the recorder costs nothing and races with
// nothing. The variable must be set before the recorder's first use, and setenv is not safe beside
// other threads, hence main().
void flight_recorder_off_by_default() {
  if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr && std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr) {
    ::setenv("TORCH_FR_BUFFER_SIZE", "0", 0);
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                          int64_t world_size, const ProcessGroupOptions& options) {
  // A peer that closed its sockets makes the next write raise SIGPIPE, which would kill this process
  // without a word; ignored, the write fails and the collective throws a clear error instead.
  std::signal(SIGPIPE, SIG_IGN);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, static_cast<int>(rank), static_cast<int>(world_size));
  // --debug-collectives: the backend behind c10d's fingerprinting wrapper, whose checks run over a
  // Gloo group of their own (keys under "debug/"), as TORCH_DISTRIBUTED_DEBUG=DETAIL does in Python.
  auto checked = [&](c10::intrusive_ptr<c10d::Backend> backend) -> c10::intrusive_ptr<c10d::Backend> {
    if (options.wrap_backend) backend = options.wrap_backend(backend);
    if (!options.debug_collectives) return backend;
    log::info("[process-group] --debug-collectives: rank {} checks every collective across the {} ranks first "
              "(operation, sizes, dtypes), over a Gloo group of its own",
              rank, world_size);
    auto check_options = c10d::ProcessGroupGloo::Options::create();
    check_options->timeout = options.timeout;
    check_options->devices.push_back(gloo_device(options.master_host, options.tls.get()));
    auto check_store = c10::make_intrusive<c10d::PrefixStore>("debug", store);
    auto checker = c10::make_intrusive<c10d::ProcessGroupGloo>(check_store, static_cast<int>(rank),
                                                                static_cast<int>(world_size), check_options);
    return c10::make_intrusive<c10d::ProcessGroupWrapper>(backend, checker);
  };
  try {
    if (options.backend == "gloo") {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create();
      gloo_options->timeout = options.timeout;
      gloo_options->devices.push_back(gloo_device(options.master_host, options.tls.get()));
      auto backend = checked(c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                                          static_cast<int>(world_size), gloo_options));
      group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
#ifdef HETSEQ_WITH_CUDA
      // A GPU rank among CPU ranks reduces its CUDA gradients over Gloo too.
      group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, backend);
#endif
      return group;
    }
    if (options.backend == "nccl") {
#ifdef HETSEQ_WITH_CUDA
      if (!torch::cuda::is_available()) {
        throw UsageError("--distributed-backend nccl needs CUDA devices, and none is visible; use gloo (or --cpu)");
      }
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.timeout;
      auto backend = checked(c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                                          static_cast<int>(world_size), nccl_options));
      group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
      group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, backend);
      return group;
#else
      throw UsageError("--distributed-backend nccl: this build's LibTorch has no CUDA; use gloo");
#endif
    }
  } catch (const c10::Error& e) {
    throw PeerError(fmt::format("rank {}: the {} process group of {} ranks failed to connect: {}", rank,
                                 options.backend, world_size, e.what_without_backtrace()));
  }
  throw UsageError(fmt::format("--distributed-backend: '{}' is not one of gloo, nccl", options.backend));
}

bool checks_collectives(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  if (!group->hasBackends()) return false;
  try {
    return dynamic_cast<c10d::ProcessGroupWrapper*>(group->getBackend(c10::DeviceType::CPU).get()) != nullptr;
  } catch (const c10::Error&) {
    return false;  // no CPU backend (an NCCL-only group): its buckets never go through shared memory
  }
}

}  // namespace hetseq
