// The sharded optimizer state of --zero-sharding os for a Python loop (hetseq/shard, Note [Sharded optimizer
// state]): the shard plan, the slices and views of a shard, and the gather of the updated shards, bound as they
// are, so that python/hetseq/shard.py cuts and gathers exactly as hetseq-train does.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <utility>
#include <vector>

#include "bindings.h"
#include "hetseq/balance/free_memory.h"
#include "hetseq/core/format.h"
#include "hetseq/shard/shard_gather.h"
#include "hetseq/shard/shard_plan.h"
#include "hetseq/shard/shard_report.h"
#include "hetseq/shard/sharded_optimizer.h"

namespace py = pybind11;

namespace hetseq::python {

void bind_shard(py::module_& m) {
  py::class_<ShardRange>(m, "ShardRange", "One rank's shard: elements [first, first + numel) of the flat parameters")
      .def(py::init([](int64_t first, int64_t numel) { return ShardRange{first, numel}; }), py::arg("first"),
           py::arg("numel"))
      .def_readonly("first", &ShardRange::first)
      .def_readonly("numel", &ShardRange::numel)
      .def("__eq__", &ShardRange::operator==)
      .def("__repr__",
           [](const ShardRange& r) { return fmt::format("ShardRange(first={}, numel={})", r.first, r.numel); });
  py::class_<ShardSlice>(m, "ShardSlice", "Elements [offset, offset + numel) of parameter `param` (flattened)")
      .def_readonly("param", &ShardSlice::param)
      .def_readonly("offset", &ShardSlice::offset)
      .def_readonly("numel", &ShardSlice::numel)
      .def("__repr__", [](const ShardSlice& s) {
        return fmt::format("ShardSlice(param={}, offset={}, numel={})", s.param, s.offset, s.numel);
      });
  m.def(
      "plan_shards",
      [](const std::vector<int64_t>& budget_bytes, int64_t total_numel, int64_t alignment) {
        return plan_shards(budget_bytes, total_numel, alignment, Naming::kPython);  // memory_budget, not the flag
      },
      "Every rank's shard ([rank]) of `total_numel` elements in proportion to `budget_bytes` ([rank]), boundaries "
      "at multiples of `alignment`; hetseq.InputError naming the rank (and memory_budget) for a budget <= 0 or one "
      "too small",
      py::arg("budget_bytes"), py::arg("total_numel"), py::arg("alignment") = 16);
  m.def("shard_slices", &shard_slices, "The slices of the parameters of `param_numels` that fall in `range`",
        py::arg("param_numels"), py::arg("range"));
  m.def("slice_views", &slice_views, "1-D views of `params` (contiguous) for `slices`, sharing their storage",
        py::arg("params"), py::arg("slices"));
  m.def("exchange_budgets", &exchange_budgets,
        "A collective: every rank's memory budget in bytes, [rank]; hetseq.PeerError when a peer is lost",
        py::arg("group"), py::arg("budget_bytes"), py::arg("device"), py::call_guard<py::gil_scoped_release>());
  m.def("free_memory_bytes", &free_memory_bytes,
        "The memory free on `device` in bytes (the CPU's: MemAvailable and the cgroup's room): the default budget",
        py::arg("device"), py::call_guard<py::gil_scoped_release>());
  // Deleted with the GIL released: Note [Process groups at exit] (bindings.h).
  py::class_<ShardGather, ReleaseGilPtr<ShardGather>>(
      m, "ShardGather", "Gathers every rank's updated shard of the parameters to every rank")
      .def(py::init([](c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<ShardRange> plan,
                       std::vector<torch::Tensor> params, bool allgather) {
             return ReleaseGilPtr<ShardGather>(new ShardGather(std::move(group), std::move(plan), std::move(params),
                                                               allgather ? GatherMethod::kAllgatherPadded
                                                                         : GatherMethod::kBroadcastPerRank));
           }),
           py::arg("group"), py::arg("plan"), py::arg("params"), py::arg("allgather") = false)
      .def("gather", &ShardGather::gather, "A collective: writes every other rank's shard into this rank's tensors",
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("plan", &ShardGather::plan)
      .def_property_readonly("rank", &ShardGather::rank);
  py::class_<ShardReport>(m, "ShardReport", "One rank's line of the shard plan (hetseq/shard/shard_report.h)")
      .def(py::init<>())
      .def_readwrite("rank", &ShardReport::rank)
      .def_readwrite("first", &ShardReport::first)
      .def_readwrite("numel", &ShardReport::numel)
      .def_readwrite("state_bytes", &ShardReport::state_bytes)
      .def_readwrite("budget_bytes", &ShardReport::budget_bytes)
      .def_readwrite("param_bytes", &ShardReport::param_bytes)
      .def_readwrite("grad_bytes", &ShardReport::grad_bytes);
  m.def("exchange_shard_reports", &exchange_shard_reports, "A collective: every rank's ShardReport, [rank]",
        py::arg("group"), py::arg("mine"), py::arg("device"), py::call_guard<py::gil_scoped_release>());
  m.def("print_shard_reports", &print_shard_reports,
        "Logs every rank's line with the [zero] prefix and, when `json`, prints each as hetseq-train's `shard` JSON "
        "line on stdout",
        py::arg("reports"), py::arg("json"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace hetseq::python
