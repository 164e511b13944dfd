#pragma once

#include <cstdint>

#include "hetseq/data/epoch_batch_iterator.h"

namespace hetseq {

class Controller;

/// Where the ranks that took part in an update stand after it: what a rank that sat it out is told when
/// they call it (Note [Sharing an update]).
struct Meeting {
  int64_t epoch = 1;
  int64_t num_updates = 0;     // the update after which every rank meets
  int64_t index_in_epoch = 0;  // the TrainingLoop's count of that update in the epoch
  IteratorPosition next;       // where the data stands after it
  bool stop = false;           // the ranks that took part agreed to stop after it
};

/// Which ranks take part in the updates, when a balanced split gives some a share of 0 (Note [Sitting
/// out]): the TrainingLoop asks it before each update and tells it after; the balancer's roster
/// (hetseq/balance/sit_out_roster.h) implements it. None in a run that cannot sit ranks out.
class UpdateRoster {
 public:
  virtual ~UpdateRoster() = default;
  /// Whether this rank sits out the coming updates.
  virtual bool sitting_out() const = 0;
  /// A rank that takes part, before each update.
  virtual void before_update() {}
  /// A rank that took part, after each update and its observers. `everyone` says whether every rank is
  /// needed after it (a save, the epoch's end, a stop, the update limit). The ranks that sat out are then
  /// called and take rank 0's state, as are the ranks a new split takes back; a new split's ranks take
  /// part from the next update on.
  virtual void after_update(Controller& controller, const Meeting& here, bool everyone) = 0;
  /// A rank that sits out: measures itself now and then, off the others' path, until they call it; then
  /// takes rank 0's state and the split in force. Returns where the others stand.
  virtual Meeting wait(Controller& controller) = 0;
  /// A rank that takes part, before each update's stop vote: whether a rank that sits out was asked to stop
  /// (SIGTERM to its node alone). Rank 0 then votes to stop, and the run stops as if it had been asked.
  virtual bool stop_asked() { return false; }
};

}  // namespace hetseq
