// hetseq-train's checkpoint file from Python: the Checkpoint value as it is, written and read by the library's
// own writer and reader (Note [Checkpoint file]), so that the file is one that hetseq-eval and torch.load read.
// python/hetseq/checkpoint.py fills it from a Python loop's model, optimizer and plan.

#include <filesystem>
#include <string>

#include "bindings.h"
#include "hetseq/checkpoint/checkpoint_file.h"
#include "hetseq/checkpoint/training_state.h"
#include "hetseq/train/controller_detail.h"
#include "hetseq/world/handshake.h"
#include "tensors_module.h"

namespace py = pybind11;

namespace hetseq::python {

void bind_checkpoint(py::module_& m) {
  py::class_<Checkpoint>(m, "Checkpoint", "What a hetseq checkpoint holds (hetseq/checkpoint/checkpoint.h)")
      .def(py::init<>())
      .def_readwrite("model", &Checkpoint::model)
      .def_readwrite("optimizer_name", &Checkpoint::optimizer_name)
      .def_readwrite("optimizer_options", &Checkpoint::optimizer_options)
      .def_readwrite("optimizer_state", &Checkpoint::optimizer_state)
      .def_readwrite("lr_scheduler_name", &Checkpoint::lr_scheduler_name)
      .def_readwrite("lr_scheduler_state", &Checkpoint::lr_scheduler_state)
      .def_readwrite("num_updates", &Checkpoint::num_updates)
      .def_readwrite("meters", &Checkpoint::meters)
      .def_readwrite("rng_state", &Checkpoint::rng_state)
      .def_readwrite("cuda_rng_states", &Checkpoint::cuda_rng_states)
      .def_readwrite("bucket_layout", &Checkpoint::bucket_layout)
      .def_readwrite("epoch", &Checkpoint::epoch)
      .def_readwrite("offset", &Checkpoint::offset)
      .def_readwrite("best", &Checkpoint::best)
      .def_property(
          "batch_sizes", [](const Checkpoint& c) { return c.data_plan.batch_sizes; },
          [](Checkpoint& c, std::vector<int64_t> v) { c.data_plan.batch_sizes = std::move(v); })
      .def_property(
          "update_freqs", [](const Checkpoint& c) { return c.data_plan.update_freqs; },
          [](Checkpoint& c, std::vector<int64_t> v) { c.data_plan.update_freqs = std::move(v); })
      .def_property(
          "shares", [](const Checkpoint& c) { return c.data_plan.shares; },
          [](Checkpoint& c, std::vector<int64_t> v) { c.data_plan.shares = std::move(v); })
      .def_readwrite("task", &Checkpoint::task)
      .def_readwrite("model_digest", &Checkpoint::model_digest)
      .def_readwrite("options", &Checkpoint::options)
      .def_readonly("torch_version", &Checkpoint::torch_version)
      .def_readonly("format_version", &Checkpoint::format_version);
  m.def(
      "save_checkpoint",
      [](const Checkpoint& c, const std::string& path) { save_checkpoint(c, {std::filesystem::path(path)}); },
      "Writes `checkpoint` to `path` atomically (a temporary file renamed over it); hetseq.InputError naming the "
      "file when it cannot be written",
      py::arg("checkpoint"), py::arg("path"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "load_checkpoint", [](const std::string& path) { return load_checkpoint(path); },
      "Reads and verifies a checkpoint file; hetseq.InputError naming it when it is damaged or not one",
      py::arg("path"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "model_digest",
      [](const NamedTensors& parameters, const NamedTensors& buffers) {
        return model_digest(TensorsModule(parameters, buffers));
      },
      "The digest of the parameters' and buffers' names and shapes that hetseq-train keeps in a checkpoint",
      py::arg("parameters"), py::arg("buffers"));
  m.def(
      "load_model",
      [](const NamedTensors& parameters, const NamedTensors& buffers, const Checkpoint& c, const std::string& source) {
        TensorsModule module(parameters, buffers);
        load_model_tensors(module, c.model, source);
      },
      "Copies a checkpoint's model entries into the tensors; hetseq.InputError naming `source` on a missing or "
      "extra name or another shape, and then none is changed",
      py::arg("parameters"), py::arg("buffers"), py::arg("checkpoint"), py::arg("source"),
      py::call_guard<py::gil_scoped_release>());
  m.def("update_seed", &detail::update_seed,
        "The seed of an update's random draws from (seed, update count, rank), as hetseq-train draws them",
        py::arg("seed"), py::arg("num_updates"), py::arg("rank"));
}

}  // namespace hetseq::python
