// hetseq._C: hetseq's C++ machinery for a Python training loop (issue "hetseq from Python"). A Python
// nn.Parameter reaches C++ as the same at::Tensor, and a torch.distributed process group as the same
// c10d::ProcessGroup, so the reducer's hooks fire on the user's own parameters in the user's own group.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/torch.h>
#include <c10/util/Backtrace.h>

#include <cstdio>
#include <exception>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hetseq/core/error.h"
#include "hetseq/core/format.h"
#include "hetseq/data/data_plan.h"
#include "hetseq/data/epoch_batch_iterator.h"
#include "hetseq/reduce/ddp_reducer.h"
#include "hetseq/version.h"
#include "bindings.h"
#include "tensors_module.h"

namespace py = pybind11;

namespace hetseq::python {

// The exact sample-weighted reduction for a Python loop: DistributedReducer over the Python module's
// tensors, and the division by the update's sample count summed over the ranks.
class Reducer {
 public:
  /// `initial_buckets`: a checkpoint's bucket layout, so that a resumed run reduces in the order of the run
  /// that saved it (Note [Bucketed reduction]); empty: the default layout.
  Reducer(const NamedTensors& parameters, const NamedTensors& buffers, c10::intrusive_ptr<c10d::ProcessGroup> group,
          double bucket_cap_mb, bool broadcast_buffers, const std::string& shared_memory, double timeout_s,
          std::vector<std::vector<int64_t>> initial_buckets)
      : group_(group), module_(std::make_shared<TensorsModule>(parameters, buffers)) {
    for (const auto& [name, t] : parameters) {
      if (t.requires_grad()) params_.push_back(t);
    }
    // The reducer's messages name DistributedDataParallel's keywords, not hetseq-train's flags (Note [Options in
    // the user's words], hetseq/core/option_names.h).
    DdpOptions options;
    options.naming = Naming::kPython;
    options.bucket_cap_mb = bucket_cap_mb;
    options.broadcast_buffers = broadcast_buffers;
    options.shared_memory = parse_shared_memory_reduce(shared_memory, Naming::kPython);
    options.shared_memory_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    options.initial_buckets = std::move(initial_buckets);
    options.validate();
    reducer_ = std::make_unique<DistributedReducer>(*module_, std::move(group), options);
  }

  void before_forward() { reducer_->before_forward(); }
  void before_backward(int64_t index, int64_t count, const torch::Tensor& loss) {
    reducer_->before_backward(index, count, loss);
  }
  /// Starts the allreduce of this rank's samples in the update, before its backward passes, so that the sum
  /// travels while they compute (as the trainer's statistics do: Note [Stat sync]).
  void start_samples(double local_samples) {
    samples_ = {at::full({1}, local_samples, at::kDouble)};
    samples_work_ = group_->allreduce(samples_);
  }
  /// After the update's last backward: sums every gradient over the ranks, then divides it by the update's
  /// samples over all ranks (start_samples's sum, or `local_samples` summed now where it was not started).
  /// Returns that total.
  double finish_update(double local_samples) {
    reducer_->finish_update();
    try {
      if (!samples_work_) start_samples(local_samples);
      samples_work_->wait();
    } catch (const PeerError&) {
      samples_work_.reset();
      throw;
    } catch (const std::exception& e) {
      samples_work_.reset();
      throw PeerError(fmt::format("rank {} of {}: the update's sample count could not be summed over the ranks, a "
                                  "peer was lost (it died, was stopped, or hangs past the timeout): {}",
                                  group_->getRank(), group_->getSize(), e.what()));
    }
    samples_work_.reset();
    const double samples = samples_[0].item<double>();
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().div_(samples);
    }
    return samples;
  }
  bool gradients_in_shared_memory() const { return reducer_->gradients_in_shared_memory(); }
  /// The bucket layout in force, [bucket][parameter index], for a checkpoint.
  std::vector<std::vector<int64_t>> bucket_layout() const { return reducer_->bucket_layout(); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::shared_ptr<TensorsModule> module_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<DistributedReducer> reducer_;
  std::vector<at::Tensor> samples_;                 // [1] this update's samples, then their sum over the ranks
  c10::intrusive_ptr<c10d::Work> samples_work_;     // the allreduce of samples_ in flight
};

// The per-rank data plan (Note [Data plan]): every rank's micro-batches of each update, as sample indices, every
// sample of an epoch once across the ranks, in the order hetseq-train draws for the same seed.
class Plan {
 public:
  Plan(int64_t dataset_size, std::vector<int64_t> batch_sizes, std::vector<int64_t> update_freqs, int64_t rank,
       uint64_t seed, bool shuffle) {
    DataPlan plan;
    plan.batch_sizes = std::move(batch_sizes);
    plan.update_freqs = update_freqs.empty() ? std::vector<int64_t>(plan.batch_sizes.size(), 1) : std::move(update_freqs);
    plan.rank = rank;
    plan.validate(Naming::kPython);  // its messages name hetseq.data.Plan's arguments (Note [Options in the user's words])
    EpochIteratorOptions options;
    options.seed = seed;
    options.shuffle = shuffle;
    options.naming = Naming::kPython;
    iterator_ = std::make_unique<EpochBatchIterator>(dataset_size, plan, options);
  }
  void begin_epoch(int64_t epoch) { iterator_->begin_epoch(epoch); }
  bool end_of_epoch() const { return iterator_->end_of_epoch(); }
  std::vector<std::vector<int64_t>> next_update() { return iterator_->next_update(); }
  int64_t updates_per_epoch() const { return iterator_->updates_per_epoch(); }
  std::pair<int64_t, int64_t> position() const { return {iterator_->position().epoch, iterator_->position().offset}; }
  void restore(int64_t epoch, int64_t offset) { iterator_->restore(IteratorPosition{epoch, offset}); }
  /// A balanced split from the next update on: rank r takes `shares[r]` samples in `micro_batches[r]`
  /// micro-batches; the position in the epoch's permutation is kept (Note [Data plan]).
  void set_shares(std::vector<int64_t> shares, std::vector<int64_t> micro_batches) {
    iterator_->set_plan(
        DataPlan::from_shares(std::move(shares), std::move(micro_batches), iterator_->plan().rank, Naming::kPython));
  }

 private:
  std::unique_ptr<EpochBatchIterator> iterator_;
};

}  // namespace hetseq::python

namespace {

// A C++ std::terminate in a Python process (an exception out of a noexcept function, a joinable std::thread
// destroyed) prints only "terminate called ..." and Python's faulthandler shows no Python frame for it: this
// handler adds the C++ stack, then hands on to the handler it replaced.
std::terminate_handler g_previous_terminate = nullptr;

[[noreturn]] void terminate_with_backtrace() {
  const std::string trace = c10::get_backtrace(/*frames_to_skip=*/1);
  std::fprintf(stderr, "hetseq._C: std::terminate, C++ stack:\n%s\n", trace.c_str());
  std::fflush(stderr);
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  using namespace hetseq::python;
  g_previous_terminate = std::set_terminate(&terminate_with_backtrace);
  m.doc() = "hetseq's C++ machinery for Python training loops";
  m.attr("__version__") = HETSEQ_VERSION_STRING;
  m.attr("torch_version") = TORCH_VERSION;
  auto usage = py::register_exception<hetseq::UsageError>(m, "UsageError", PyExc_ValueError);
  auto input = py::register_exception<hetseq::InputError>(m, "InputError", PyExc_RuntimeError);
  auto peer = py::register_exception<hetseq::PeerError>(m, "PeerError", PyExc_RuntimeError);
  (void)usage;
  (void)input;
  (void)peer;
  // A PeerError raised inside autograd's engine (a reducer's hook) reaches Python as a RuntimeError with its text;
  // the package asks this to tell it from the loop's own errors.
  m.def("peer_failure_seen", &hetseq::peer_failure_seen,
        "Whether a hetseq.PeerError was raised in this process, on any thread (a collective lost a peer)");
  // Note [Process groups at exit], (4): a tensor that Python created and handed to a Gloo collective may be
  // released last by Gloo's worker thread, which then needs the GIL: during the interpreter's finalization that
  // ended the process ("terminate called without an active exception", after a checkpoint's all_reduce, about
  // 1 run in 8 of the hetseq-eval test). The package's own agreements therefore go through tensors made here,
  // which have no Python object.
  m.def(
      "any_rank",
      [](bool mine, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        std::vector<at::Tensor> flag{at::full({1}, mine ? 1 : 0, at::kInt)};
        try {
          group->allreduce(flag)->wait();
        } catch (const std::exception& e) {
          throw hetseq::PeerError(fmt::format("rank {} of {}: an agreement of the ranks failed, a peer was lost: {}",
                                      group->getRank(), group->getSize(), e.what()));
        }
        return flag[0].item<int>() > 0;
      },
      py::arg("mine"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "Whether any rank of `group` passed true (a collective: every rank calls it at the same point)");
  py::class_<Reducer, ReleaseGilPtr<Reducer>>(m, "Reducer")  // Note [Process groups at exit] (bindings.h)
      .def(py::init<const NamedTensors&, const NamedTensors&, c10::intrusive_ptr<c10d::ProcessGroup>, double, bool,
                    const std::string&, double, std::vector<std::vector<int64_t>>>(),
           py::arg("parameters"), py::arg("buffers"), py::arg("group"), py::arg("bucket_cap_mb") = 25.0,
           py::arg("broadcast_buffers") = true, py::arg("shared_memory") = "auto", py::arg("timeout_s") = 300.0,
           py::arg("initial_buckets") = std::vector<std::vector<int64_t>>{}, py::call_guard<py::gil_scoped_release>())
      .def("before_forward", &Reducer::before_forward, py::call_guard<py::gil_scoped_release>())
      .def("before_backward", &Reducer::before_backward, py::call_guard<py::gil_scoped_release>())
      .def("start_samples", &Reducer::start_samples, py::call_guard<py::gil_scoped_release>())
      .def("finish_update", &Reducer::finish_update, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("gradients_in_shared_memory", &Reducer::gradients_in_shared_memory)
      .def_property_readonly("bucket_layout", &Reducer::bucket_layout);
  py::class_<Plan>(m, "Plan")
      .def(py::init<int64_t, std::vector<int64_t>, std::vector<int64_t>, int64_t, uint64_t, bool>(),
           py::arg("dataset_size"), py::arg("batch_sizes"), py::arg("update_freqs"), py::arg("rank"), py::arg("seed"),
           py::arg("shuffle"))
      .def("begin_epoch", &Plan::begin_epoch)
      .def("end_of_epoch", &Plan::end_of_epoch)
      .def("next_update", &Plan::next_update)
      .def("updates_per_epoch", &Plan::updates_per_epoch)
      .def("position", &Plan::position)
      .def("restore", &Plan::restore)
      .def("set_shares", &Plan::set_shares);
  bind_checkpoint(m);
  bind_balance(m);
  bind_shard(m);
  bind_train(m);
}
