#include "hetseq/reduce/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include <ATen/ATen.h>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/reduce/ddp_options.h"

namespace hetseq {

// Note [A segment and its barrier]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ranks of one machine share one /dev/shm file: rank 0 creates it under a random name and reserves its
// pages (posix_fallocate: a full /dev/shm is an error at start, not a SIGBUS mid-training), broadcasts the
// name, every rank maps it, and rank 0 unlinks the name once every rank reports its mapping, so the memory
// goes with the last process that maps it, also after a crash. Before that, an allgather of a machine id (host
// name, boot id and network namespace) checks that the ranks share the machine: two containers with one host
// name are not one machine, and ranks in different network namespaces stand for different nodes (as
// tests/world/test_two_nodes.cpp's two nodes do), so they talk over the network.
//
// The barrier is a count and a generation word in the header: the last rank to arrive resets the count,
// bumps the generation and wakes the others, who wait on the generation word with a futex (shared between
// processes), after a short spin. A rank that waits longer than the process group's timeout throws a
// PeerError naming the ranks that did not arrive (each rank's own count of arrivals is in the header), so a
// dead peer is an error, not a hang. A peer whose process has exited (seen where it shares this process's pid
// namespace: the header keeps every rank's pid and pid namespace) fails the wait at once, as a closed socket
// fails Gloo's.

struct SharedSegment::Header {
  alignas(64) std::atomic<uint32_t> count;
  alignas(64) std::atomic<uint32_t> generation;
  alignas(64) std::atomic<uint64_t> arrivals[kMaxRanks];  // [rank] barriers reached
  std::atomic<int64_t> pids[kMaxRanks];                   // [rank] process id
  std::atomic<uint64_t> pid_namespaces[kMaxRanks];        // [rank] inode of its pid namespace
};

struct SharedSegment::Mapping {
  void* base;
  size_t bytes;
  Mapping(void* b, size_t n) : base(b), bytes(n) {}
  ~Mapping() { ::munmap(base, bytes); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

namespace {

// Whether process `pid` (of this pid namespace) still runs: not gone, not a zombie (a killed rank stays one
// until whoever started it reaps it).
bool process_alive(int64_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// This machine: its host name, boot id and network namespace (Note [A segment and its barrier]).
int64_t machine_id() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char netns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
  if (n > 0) netns[n] = 0;
  return static_cast<int64_t>(std::hash<std::string>{}(std::string(host) + "/" + boot + "/" + netns) &
                              0x7fffffffffffffffULL);
}

}  // namespace

SharedSegment::SharedSegment(c10d::ProcessGroup& group, size_t bytes, bool eligible,
                             const std::function<void(const std::string&)>& fail, Naming naming)
    : rank_(group.getRank()), world_(group.getSize()), naming_(naming) {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header is one page");
  if (world_ > kMaxRanks) {  // the same on every rank: no collective skipped unevenly
    fail(fmt::format("{} ranks; it serves at most {} ranks of one machine", world_, kMaxRanks));
    return;
  }
  // Every rank on this machine?
  {
    // A rank that cannot take part says so with an id no machine has.
    std::vector<at::Tensor> in{at::full({1}, eligible ? machine_id() : -1 - int64_t{rank_}, at::kLong)};
    std::vector<std::vector<at::Tensor>> outs{{}};
    for (int r = 0; r < world_; ++r) outs[0].push_back(at::empty({1}, at::kLong));
    group.allgather(outs, in)->wait();
    for (int r = 0; r < world_; ++r) {
      if (outs[0][static_cast<size_t>(r)].item<int64_t>() != outs[0][0].item<int64_t>()) {
        fail(fmt::format("rank {} runs on another machine than rank 0 (or in another network namespace), or one "
                         "of them has its parameters off the CPU; shared memory serves CPU ranks of one machine only: "
                         "use {} or {}",
                         r, kSharedMemoryOption.set_to(naming_, "auto"), kSharedMemoryOption.value(naming_, "off")));
        return;
      }
    }
  }
  mapped_bytes_ = kHeaderBytes + bytes;

  // Rank 0 creates the segment and broadcasts its name.
  std::string name;
  std::string error;
  if (rank_ == 0) {
    std::random_device random;
    name = fmt::format("/hetseq-reduce-{}-{:08x}", ::getpid(), random());
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      error = fmt::format("cannot create /dev/shm{}: {}", name, std::strerror(errno));
    } else {
      const int rc = ::ftruncate(fd, static_cast<off_t>(mapped_bytes_)) != 0 ? errno
                     : ::posix_fallocate(fd, 0, static_cast<off_t>(mapped_bytes_));
      if (rc != 0) {
        error = fmt::format("cannot reserve {} bytes in /dev/shm ({}): {}", mapped_bytes_, name, std::strerror(rc));
        ::shm_unlink(name.c_str());
      }
      ::close(fd);
    }
  }
  at::Tensor name_bytes = at::zeros({128}, at::kByte);
  if (rank_ == 0) {
    const std::string sent = error.empty() ? name : "!" + error.substr(0, 126);
    std::memcpy(name_bytes.data_ptr(), sent.data(), std::min<size_t>(sent.size(), 127));
  }
  std::vector<at::Tensor> name_tensor{name_bytes};
  // A peer that fails these collectives (dead, or timed out) must leave neither the name in /dev/shm nor the
  // mapping behind (the destructor does not run for a constructor that throws).
  auto unlink_on_error = [&](const std::function<void()>& collective) {
    try {
      collective();
    } catch (...) {
      if (rank_ == 0) ::shm_unlink(name.c_str());
      if (base_) ::munmap(base_, mapped_bytes_);
      base_ = nullptr;
      throw;
    }
  };
  unlink_on_error([&] { group.broadcast(name_tensor)->wait(); });
  name = std::string(static_cast<const char*>(name_bytes.data_ptr()));
  if (!name.empty() && name[0] == '!') {
    segment_failed_ = true;
    fail(fmt::format("rank 0 {}; free /dev/shm or use {}", name.substr(1), kSharedMemoryOption.set_to(naming_, "off")));
    return;
  }
  // Every rank maps it; the name goes once all have (or one has failed).
  int ok = 1;
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd >= 0) {
    base_ = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base_ == MAP_FAILED) base_ = nullptr;
    ::close(fd);
  }
  if (!base_) {
    error = fmt::format("rank {} cannot map /dev/shm{}: {}", rank_, name, std::strerror(errno));
    ok = 0;
  }
  std::vector<at::Tensor> flags{at::full({1}, ok, at::kInt)};
  unlink_on_error([&] { group.allreduce(flags)->wait(); });
  if (rank_ == 0) ::shm_unlink(name.c_str());
  if (flags[0].item<int>() != world_) {
    if (base_) ::munmap(base_, mapped_bytes_);
    base_ = nullptr;
    segment_failed_ = true;
    fail(error.empty() ? "another rank could not map the segment (its error says why)" : error);
    return;
  }
  mapping_ = std::make_shared<Mapping>(base_, mapped_bytes_);
  header_ = static_cast<Header*>(base_);  // zero-filled by ftruncate: count 0, generation 0, arrivals 0
  header_->pids[rank_].store(::getpid());
  pid_namespace_ = pid_namespace();
  header_->pid_namespaces[rank_].store(pid_namespace_);
}

bool SharedSegment::holds(const void* p) const {
  const char* at = static_cast<const char*>(p);
  const char* base = static_cast<const char*>(base_);
  return base && at >= base && at < base + mapped_bytes_;
}

void SharedSegment::restart_count() {
  round_ = 0;
  header_->arrivals[rank_].store(0, std::memory_order_release);
}

void SharedSegment::barrier(const std::vector<int>& members, std::chrono::milliseconds timeout, int64_t index,
                            const char* phase, const std::atomic<bool>& abandoned) {
  ++round_;
  header_->arrivals[rank_].store(round_, std::memory_order_release);
  const uint32_t generation = header_->generation.load(std::memory_order_acquire);
  if (header_->count.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(members.size())) {
    header_->count.store(0, std::memory_order_relaxed);
    header_->generation.fetch_add(1, std::memory_order_acq_rel);
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header_->generation), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    return;
  }
  for (int spin = 0; spin < 200; ++spin) {
    if (header_->generation.load(std::memory_order_acquire) != generation) return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = deadline - std::chrono::steady_clock::now();
  for (;;) {
    // Sleep on the generation word; wake up at least every 100 ms to check on the peers and the deadline (a
    // barrier that completes within the first nap reads nothing from /proc).
    const auto nap = std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(100));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count();
    timespec wait{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header_->generation), FUTEX_WAIT, generation, &wait, nullptr, 0);
    if (header_->generation.load(std::memory_order_acquire) != generation) return;
    if (abandoned) throw PeerError(fmt::format("rank {}: the shared-memory reduction of bucket {} was abandoned", rank_, index));
    left = deadline - std::chrono::steady_clock::now();
    std::vector<int> missing;
    for (int r : members) {
      if (header_->arrivals[r].load(std::memory_order_acquire) < round_) missing.push_back(r);
    }
    for (int r : missing) {
      const int64_t pid = header_->pids[r].load();
      if (pid > 0 && header_->pid_namespaces[r].load() == pid_namespace_ && !process_alive(pid)) {
        throw PeerError(fmt::format(
            "rank {} of {}: the shared-memory reduction of gradient bucket {} failed: rank {} (process {}) has exited "
            "(a peer died, fell behind past the process group's timeout, or ran a different number of backward passes)",
            rank_, world_, index, r, pid));
      }
    }
    if (left <= std::chrono::steady_clock::duration::zero()) {
      throw PeerError(fmt::format(
          "rank {} of {}: the shared-memory reduction of gradient bucket {} ({}) failed: rank(s) {} did not reach it "
          "within {} ({} s) (a peer died, fell behind past the process group's timeout, or ran a "
          "different number of backward passes)",
          rank_, world_, index, phase, fmt::join(missing, ", "), kSharedMemoryTimeoutOption.name(naming_),
          std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
    }
  }
}

}  // namespace hetseq
