#pragma once
// Archives in torch.save's format of a value tree: held in memory, or streamed to a file tensor by
// tensor. Helpers of hetseq/checkpoint/checkpoint_format.h; see Note [Streamed save].

#include <cstddef>
#include <functional>
#include <unordered_map>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/types.h>

namespace hetseq::detail {

/// The tensors of one streamed archive, from building its value tree until they are written. A tensor
/// enters the tree as stage() gives it; write_archive, and the checkpoint's checksum, ask data() for
/// its bytes. See Note [Streamed save].
class ArchiveTensors {
 public:
  /// What to put into the tree for `t`, which the archive stores as `t.to(kCPU).contiguous()`: `t`
  /// itself when it is a contiguous CPU tensor (its memory is written as it is), else a stand-in: a
  /// CPU tensor of that copy's dtype, shape, strides and storage size whose storage has no memory.
  torch::Tensor stage(const torch::Tensor& t);

  /// The contiguous CPU tensor holding the values of `staged` (a tensor of the tree), laid out in its
  /// storage as `staged` is: for a stand-in a copy of the tensor it stands for, made now.
  torch::Tensor data(const torch::Tensor& staged) const;

 private:
  struct StandIn {
    c10::Storage storage;  // the stand-in's, held so that its address names it until the archive is written
    torch::Tensor source;
  };
  std::unordered_map<const c10::StorageImpl*, StandIn> stand_ins_;  // [stand-in's storage]
};

/// Writes the archive of `root` (whose tensors came from `tensors.stage`) through `write`, in order:
/// each tensor's record from the memory data() gives (so one stand-in's copy at a time), then the
/// pickle, then the zip directory. The bytes equal those of archive_bytes for the same tree with
/// `t.to(kCPU).contiguous()` in place of each stage(t). `write` returns false once writing failed;
/// the remaining records are skipped then (the caller reports the failure).
void write_archive(const c10::IValue& root, const ArchiveTensors& tensors,
                   const std::function<bool(const void*, size_t)>& write);

/// The archive of `root`, whose tensors must be CPU tensors, in memory (tests and tools; a save streams
/// with write_archive).
std::vector<char> archive_bytes(const c10::IValue& root);

}  // namespace hetseq::detail
