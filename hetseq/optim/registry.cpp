#include "hetseq/optim/registry.h"

#include "hetseq/core/error.h"

namespace hetseq::optim {

// Each optimizer's and schedule's spec, defined next to its class.
OptimizerSpec adam_spec();
OptimizerSpec adadelta_spec();
OptimizerSpec sgd_spec();
LrSchedulerSpec polynomial_decay_spec();
LrSchedulerSpec fixed_spec();
LrSchedulerSpec inverse_sqrt_spec();

template <class Spec>
void Registry<Spec>::add(Spec spec) {
  const std::string name = spec.name;
  if (!specs_.emplace(name, std::move(spec)).second) {
    throw InternalError(fmt::format("{} '{}' is registered twice", flag_, name));
  }
}

template <class Spec>
const Spec& Registry<Spec>::get(const std::string& name) const {
  auto it = specs_.find(name);
  if (it == specs_.end()) {
    throw UsageError(fmt::format("{}: '{}' is not one of {}", flag_, name, fmt::join(names(), ", ")));
  }
  return it->second;
}

template <class Spec>
std::vector<std::string> Registry<Spec>::names() const {
  std::vector<std::string> out;
  for (const auto& entry : specs_) out.push_back(entry.first);
  return out;
}

template class Registry<OptimizerSpec>;
template class Registry<LrSchedulerSpec>;

namespace {

template <class Spec>
Registry<Spec> make_registry(const std::string& flag, std::initializer_list<Spec (*)()> specs) {
  Registry<Spec> r(flag);
  for (auto spec : specs) r.add(spec());
  return r;
}

}  // namespace

Registry<OptimizerSpec>& optimizers() {
  static Registry<OptimizerSpec> registry = make_registry<OptimizerSpec>("--optimizer", {adam_spec, adadelta_spec, sgd_spec});
  return registry;
}

Registry<LrSchedulerSpec>& lr_schedulers() {
  static Registry<LrSchedulerSpec> registry =
      make_registry<LrSchedulerSpec>("--lr_scheduler", {polynomial_decay_spec, fixed_spec, inverse_sqrt_spec});
  return registry;
}

}  // namespace hetseq::optim
