#include "hetseq/optim/lr_scheduler.h"

#include <algorithm>

#include "hetseq/core/format.h"

#include "hetseq/core/error.h"

namespace hetseq::optim {

LrScheduler::LrScheduler(Optimizer& optimizer) : optimizer_(optimizer) {}

LrScheduler::~LrScheduler() = default;

double LrScheduler::step(int64_t epoch, std::optional<double> val_loss) {
  HETSEQ_ASSERT(epoch >= 0, "lr scheduler '{}' stepped with epoch {}", name(), epoch);
  if (val_loss) best_ = best_ ? std::min(*best_, *val_loss) : *val_loss;
  return optimizer_.lr();
}

double LrScheduler::step_update(int64_t num_updates) {
  HETSEQ_ASSERT(num_updates >= 0, "lr scheduler '{}' stepped with num_updates {}", name(), num_updates);
  return optimizer_.lr();
}

std::map<std::string, double> LrScheduler::state() const {
  std::map<std::string, double> out;
  if (best_) out["best"] = *best_;
  return out;
}

void LrScheduler::load_state(const std::map<std::string, double>& state) {
  const std::map<std::string, double> own = this->state();
  for (const auto& [key, value] : state) {
    if (key != "best" && own.count(key) == 0) {
      throw InputError(fmt::format("lr scheduler '{}': cannot load its state: unknown entry '{}'; the checkpoint "
                                   "was saved with a different --lr-scheduler",
                                   name(), key));
    }
  }
  const auto it = state.find("best");
  best_ = it == state.end() ? std::nullopt : std::optional<double>(it->second);
}

double LrScheduler::required_entry(const std::map<std::string, double>& state, const std::string& key) const {
  const auto it = state.find(key);
  if (it == state.end()) {
    throw InputError(fmt::format("lr scheduler '{}': cannot load its state: entry '{}' is missing; the checkpoint "
                                 "was saved with a different --lr-scheduler",
                                 name(), key));
  }
  return it->second;
}

}  // namespace hetseq::optim
