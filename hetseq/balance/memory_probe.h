#pragma once

#include <cstdint>
#include <functional>

namespace hetseq {

/// How the largest micro-batch is found (--auto-balance on a CUDA device without --balance-cap).
struct ProbeOptions {
  int64_t start = 1;     // the first size tried (the rank's --max-sentences)
  int64_t limit = 1;     // no need to look past it (the samples of a whole update)
  double margin = 0.8;   // the cap is this share of the largest size that ran
};

/// The memory cap of Note [Balancing] when none is given: runs `try_size(b)` (one forward and
/// backward of a micro-batch of b samples) at b = start, 2 start, 4 start, ... up to `limit`, until it
/// runs out of device memory (c10::OutOfMemoryError), calling `release()` after each try; returns
/// floor(margin * the largest b that ran), at least 1, or 0 (no cap) when even `limit` ran. The margin
/// leaves room for batches larger than the probe's (longer sequences) and for fragmentation. Throws
/// hetseq::InputError when `start` itself does not fit: the rank cannot train at its --max-sentences.
int64_t probe_micro_batch_cap(const std::function<void(int64_t)>& try_size, const std::function<void()>& release,
                              const ProbeOptions& options);

}  // namespace hetseq
