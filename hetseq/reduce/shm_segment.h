#pragma once
/// A segment of shared memory that the ranks of one machine map, with a barrier in its header that notices a
/// dead peer: what the shared-memory reduction (shm_reduce.h) runs on, apart from its algorithm. See Note [A
/// segment and its barrier] (shm_segment.cpp). Internal: not installed.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hetseq/core/option_names.h"

namespace hetseq {

class SharedSegment {
 public:
  /// Unmaps the segment when the last holder goes: the segment itself and every storage moved into it.
  struct Mapping;

  /// Collective over `group` (every rank builds one at the same point): checks that every rank runs on this
  /// machine and is `eligible`, then rank 0 creates a segment of a one-page header and `bytes` after it and
  /// every rank maps it; the name is unlinked once all have, so the memory goes when the last process does,
  /// also after a crash. What stops it goes to `fail` (the same on every rank for the placement, the rank's own
  /// for a mapping), and the object is left unmapped (mapped() false); `segment_failed()` tells a full or small
  /// /dev/shm from the placement. Collective even where this rank is not eligible. `naming`: the words its
  /// messages use for the options they name (Note [Options in the user's words]).
  SharedSegment(c10d::ProcessGroup& group, size_t bytes, bool eligible, const std::function<void(const std::string&)>& fail,
                Naming naming = Naming::kFlags);
  ~SharedSegment() = default;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  bool mapped() const { return base_ != nullptr; }
  bool segment_failed() const { return segment_failed_; }
  /// The `bytes` after the header.
  char* data() const { return static_cast<char*>(base_) + kHeaderBytes; }
  /// Whether `p` points into the segment.
  bool holds(const void* p) const;
  /// What keeps the mapping alive: a storage moved into the segment holds a copy in its DataPtr.
  const std::shared_ptr<Mapping>& mapping() const { return mapping_; }

  /// Waits until every rank of `members` (in rank order, this one among them) has arrived here as often as this
  /// rank. A wait longer than `timeout`, or a member whose process has exited, throws hetseq::PeerError naming
  /// the ranks, gradient bucket `index` and `phase`; `abandoned` set by another thread gives up within 100 ms.
  void barrier(const std::vector<int>& members, std::chrono::milliseconds timeout, int64_t index, const char* phase,
               const std::atomic<bool>& abandoned);
  /// Counts this rank's arrivals afresh: every member calls it at the same point, with no barrier in flight
  /// (Note [Sharing an update]).
  void restart_count();

  int rank() const { return rank_; }
  int world() const { return world_; }

  static constexpr int kMaxRanks = 160;  // what one page of header holds
  static constexpr size_t kPage = 4096;

 private:
  static constexpr size_t kHeaderBytes = kPage;
  struct Header;
  int rank_ = 0;
  int world_ = 1;
  void* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  std::shared_ptr<Mapping> mapping_;
  Header* header_ = nullptr;
  bool segment_failed_ = false;  // the segment could not be made or mapped
  uint64_t pid_namespace_ = 0;   // of this process, to tell which peers' process ids it can check
  uint64_t round_ = 0;           // barriers this rank has passed since restart_count
  Naming naming_ = Naming::kFlags;
};

}  // namespace hetseq
