#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

namespace hetseq::optim {

/// A part of an optimizer's state over the flat element space that lays the parameters end to end in
/// their order: the elements [first, first + numel). `state` has, for each parameter i with elements in
/// the range, "param.{i}.step" and "param.{i}.{buffer}" (1-D: the parameter's elements in the range, in
/// order). A sharding strategy gives its rank's part for a checkpoint's shard file
/// (ShardingStrategy::state_piece). See Note [Sharded optimizer state in checkpoints]
/// (hetseq/shard/sharded_save.cpp).
struct StatePiece {
  int64_t first = 0;
  int64_t numel = 0;
  std::map<std::string, torch::Tensor> state;
};

/// Optimizer state kept in pieces (a sharded checkpoint's shard files), read by range: what
/// ShardingStrategy::load_state takes.
class StateSource {
 public:
  virtual ~StateSource() = default;
  /// The StatePiece of the elements [first, first + numel) for parameters of `param_numels` ([param]),
  /// assembled from whichever pieces hold them. Throws hetseq::InputError naming the file on a damaged
  /// or inconsistent piece, or when the total differs from the parameters'.
  virtual StatePiece read_range(int64_t first, int64_t numel, const std::vector<int64_t>& param_numels) const = 0;
};

/// Base class of hetseq's optimizers (Adam, Adadelta, SGD): one learning rate for all parameters, the
/// per-parameter buffers that subclasses keep (see Note [Optimizer state]) and their checkpoint form.
/// The trainer calls zero_grad(), runs backward and the reducer, then step(); an LrScheduler calls
/// set_lr() between steps.
class Optimizer {
 public:
  /// `params` are the tensors to update in place (each must be defined); `lr` is the learning rate
  /// (>= 0). Throws hetseq::UsageError naming `--lr` for a negative or non-finite lr and
  /// hetseq::InputError when `params` is empty.
  explicit Optimizer(std::vector<torch::Tensor> params, double lr);
  virtual ~Optimizer();

  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// The optimizer's name as given to `--optimizer` ("adam", "adadelta", "sgd").
  virtual std::string name() const = 0;

  /// One update from the parameters' .grad() (parameters without a grad are skipped). Runs under
  /// NoGradGuard. Called by the trainer once per update, after gradients are reduced across ranks.
  virtual void step() = 0;

  /// Whether a step runs as two parts, prepare_step() on the host and then run_step() on the device, so that a
  /// CUDA graph can hold run_step() and each replay is preceded by prepare_step() (Note [The step in a CUDA
  /// graph], optim/adam.cpp). Adam with AdamOptions::device_scalars; false by default.
  virtual bool splits_step() const { return false; }
  /// Asks for steps that split (splits_step()) from now on, with the same arithmetic; returns whether the
  /// optimizer can (Adam: it switches to AdamOptions::device_scalars). --cuda-graph asks (Note [CUDA-graph
  /// updates]).
  virtual bool use_split_step() { return false; }
  /// The host's part of a step where splits_step(): counts it (num_steps(), every update count) and fills the
  /// device tensors that run_step() reads its numbers from. Asserts splits_step().
  virtual void prepare_step();
  /// The device's part of a step where splits_step(): kernels that read their numbers from tensors only, the
  /// same kernels on the same tensors at every step while the parameters keep taking gradients. Asserts
  /// splits_step(). step() is prepare_step() then run_step().
  virtual void run_step();
  /// The tensors besides the parameters and gradients that a step reads and writes: every buffer, and the device
  /// scalars where splits_step(). A captured step holds their addresses (Note [Values frozen at capture]).
  virtual std::vector<torch::Tensor> step_tensors() const;

  /// Clears the parameters' gradients: zeroes them in place (keeping the tensors, which the reducer
  /// may view into its buckets), or makes them undefined when `set_to_none` is true.
  void zero_grad(bool set_to_none = false);

  /// The hyper-parameters besides the learning rate, by name (Adam: beta1, beta2, eps, weight_decay;
  /// SGD: momentum, weight_decay; Adadelta: rho, eps, weight_decay). Checkpoints store them, and
  /// `--optimizer-overrides` changes them on resume.
  virtual std::map<std::string, double> hyperparameters() const = 0;
  /// Sets one of hyperparameters(). Throws hetseq::UsageError for an unknown name (listing the known
  /// ones) or a value out of range; nothing changes then.
  virtual void set_hyperparameter(const std::string& name, double value) = 0;

  /// How many parameter-sized buffers the optimizer keeps per updated parameter (Adam and Adadelta 2,
  /// SGD 1 with momentum and 0 without), each in the parameter's dtype: its state is this many times the
  /// parameters it updates. The memory check reads it (Note [Memory that a rank needs]).
  virtual int64_t state_buffers() const { return static_cast<int64_t>(buffer_names().size()); }

  /// The learning rate used by the next step().
  double lr() const { return lr_; }
  /// Sets the learning rate of the next step(); called by the LR schedulers. Asserts lr >= 0.
  void set_lr(double lr);

  /// The parameters, in the order given to the constructor.
  const std::vector<torch::Tensor>& params() const { return params_; }
  /// How many times step() has run (including steps where no parameter had a gradient).
  int64_t num_steps() const { return num_steps_; }

  /// The optimizer's state as named tensors for checkpoints: "lr", "num_steps", "num_params" and, for
  /// each parameter that has been updated, "param.{i}.step" and "param.{i}.{buffer}". The buffer
  /// tensors alias the live buffers (as torch's state_dict does): serialize or clone them before the
  /// next step(). See Note [Optimizer state].
  virtual std::map<std::string, torch::Tensor> state() const;
  /// Restores a state() from an optimizer of the same kind over parameters of the same shapes, copying
  /// the tensors onto the parameters' devices. Throws hetseq::InputError naming the entry on an unknown
  /// or missing name, a shape mismatch or a different number of parameters; nothing is changed then.
  virtual void load_state(const std::map<std::string, torch::Tensor>& state);

 protected:
  /// The buffers each updated parameter has, e.g. {"exp_avg", "exp_avg_sq"}; each has the
  /// parameter's shape. load_state() requires all of them (or none) for every parameter.
  virtual std::vector<std::string> buffer_names() const = 0;

  /// The parameters that one kernel call of step() updates: those with a gradient that share a device, a
  /// compute dtype and an update count (on the CPU, a cache-sized chunk of them). See Note [Update groups].
  struct UpdateGroup {
    int64_t step = 0;                   ///< the members' update count, counting this update (1-based)
    std::vector<size_t> index;          ///< [member] the parameter's position in params(), ascending
    std::vector<torch::Tensor> params;  ///< [member] in the compute precision (fp32 copies of fp16/bf16 ones)
    std::vector<torch::Tensor> grads;   ///< [member] in the compute precision
  };

  /// The body of a subclass's step(): counts the step (num_steps() and param_step(i) of every parameter with
  /// a gradient are incremented before `update` runs), then calls `update(group)` under NoGradGuard once per
  /// UpdateGroup (per chunk on the CPU). For fp16/bf16 parameters the group holds fp32 copies, written back after `update`.
  /// Throws hetseq::InputError on a sparse gradient, before anything is updated.
  using UpdateFn = std::function<void(UpdateGroup& group)>;
  void apply_update(const UpdateFn& update);
  /// apply_update's two halves. count_step(): the checks and the counts (num_steps() and the update count of
  /// every parameter with a gradient). for_each_group(): `update` for each UpdateGroup at the counts as they
  /// are; with `copies` false the groups hold the parameters and gradients as they are (no fp32 copies of
  /// fp16/bf16 ones, nothing written back), for a walk that reads only the groups' layout and counts.
  void count_step();
  void for_each_group(const UpdateFn& update, bool copies = true);

  /// The buffer `name` of every member of `group`, created as zeros like the member where missing. The
  /// tensors alias the stored buffers: update them in place. [member]
  std::vector<torch::Tensor> buffers(const UpdateGroup& group, const std::string& name);

  /// How many updates parameter `i` has received, counting the current one inside `update`.
  int64_t param_step(size_t i) const { return param_steps_.at(i); }
  /// Whether parameter `i` has the buffer `name` yet (buffers are created at its first update).
  bool has_buffer(size_t i, const std::string& name) const;
  /// The buffer `name` of parameter `i`, created as zeros like `like` when missing.
  torch::Tensor& buffer(size_t i, const std::string& name, const torch::Tensor& like);
  /// Stores `value` as buffer `name` of parameter `i`.
  void set_buffer(size_t i, const std::string& name, torch::Tensor value);

 private:
  std::vector<torch::Tensor> params_;                        // [param]
  double lr_;
  int64_t num_steps_ = 0;
  std::vector<int64_t> param_steps_;                         // [param]
  std::vector<std::map<std::string, torch::Tensor>> buffers_;  // [param][buffer name]
};

}  // namespace hetseq::optim
