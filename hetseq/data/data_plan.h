#pragma once

#include <cstdint>
#include <vector>

#include "hetseq/core/option_names.h"

namespace hetseq {

// Note [Data plan]
// ~~~~~~~~~~~~~~~~
// Each epoch has one seeded permutation of the training split, the same on every rank. An update
// consumes the next U = sum_r u_r * b_r samples of it, where b_r is rank r's micro-batch size
// (--max-sentences, per rank) and u_r its number of micro-batches per update (--update-freq, per
// rank). Inside that chunk rank r owns the consecutive slice that starts at sum_{q<r} u_q * b_q, cut
// into u_r micro-batches of b_r samples.
//
// Consequences:
//  * every sample of the epoch is used exactly once across all ranks, whatever the batch sizes;
//  * every rank runs the same number of updates per epoch, ceil(N / U), so no rank waits on a
//    collective that others never reach;
//  * at the end of the epoch a rank's slice may be short or empty; an empty micro-batch still takes
//    part in the gradient reduction, with zero weight (see Note [Weighted averaging]);
//  * the position inside an epoch is one number, the offset of the next update's chunk in the
//    permutation. It does not depend on the world size, so a run can resume with other ranks and
//    batch sizes from the same sample on.
//
// A balanced split (Note [Balancing]) gives rank r a share s_r that need not be a multiple of its
// micro-batch count m_r (71 samples under a memory cap of 64: m_r = 2). Its slice is then s_r
// consecutive samples and micro-batch k of them covers [floor(k s_r / m_r), floor((k+1) s_r / m_r)),
// sizes that differ by at most one (36 + 35). With s_r = b_r * u_r that is the cut above.
//
// A balanced split may also give a rank a share of 0 (Note [Sitting out]): its slice is empty, its
// batch size 0 in one micro-batch, and the others' slices cover the whole chunk, so every sample is
// still used once.

/// The data plan of one rank: the micro-batch sizes and update frequencies of all ranks.
/// See Note [Data plan].
/// The plan's sizes as its messages name them (Note [Options in the user's words]): hetseq-train's flags, or the
/// arguments of hetseq.data.Plan.
inline constexpr OptionName kBatchSizesOption{"--max-sentences", "batch_sizes"};
inline constexpr OptionName kUpdateFreqsOption{"--update-freq", "update_freqs"};

struct DataPlan {
  std::vector<int64_t> batch_sizes;   // [rank] samples per micro-batch
  std::vector<int64_t> update_freqs;  // [rank] micro-batches per update
  /// [rank] samples per update, set for a balanced split; empty: batch_sizes[r] * update_freqs[r].
  /// batch_sizes[r] is then the largest micro-batch, ceil(shares[r] / update_freqs[r]).
  std::vector<int64_t> shares;
  int64_t rank = 0;                   // this rank

  /// A plan for one process: batch size `batch_size`, `update_freq` micro-batches per update.
  static DataPlan single(int64_t batch_size, int64_t update_freq);
  /// A balanced split: rank r takes `shares[r]` samples per update in `micro_batches[r]` micro-batches.
  /// `naming`: the words of validate()'s messages.
  static DataPlan from_shares(std::vector<int64_t> shares, std::vector<int64_t> micro_batches, int64_t rank,
                              Naming naming = Naming::kFlags);

  int64_t world_size() const { return static_cast<int64_t>(batch_sizes.size()); }
  /// Samples consumed by one update across all ranks (U in the Note).
  int64_t samples_per_update() const;
  /// Rank `r`'s samples per update.
  int64_t share(int64_t r) const;
  /// Every rank's samples per update, [rank].
  std::vector<int64_t> all_shares() const;
  /// Whether rank `r` has a share of 0 in a balanced split: it takes no part in the updates (Note
  /// [Sitting out]).
  bool sits_out(int64_t r) const;
  /// Offset of rank `r`'s slice inside an update's chunk.
  int64_t slice_offset(int64_t r) const;
  /// Where micro-batch `k` of rank `r` starts inside its slice (k = update_freqs[r]: the slice's end).
  int64_t micro_batch_begin(int64_t r, int64_t k) const;
  /// Checks sizes, ranks and positivity; throws hetseq::UsageError naming --max-sentences or
  /// --update-freq (batch_sizes or update_freqs in `naming`'s words).
  void validate(Naming naming = Naming::kFlags) const;
};

}  // namespace hetseq
