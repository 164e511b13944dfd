// hetseq's balancer from Python (Note [Balancing]): a rank's window of compute measurements and its fitted cost,
// and the split solver that gives every rank a share of the update's samples with equal predicted finish times.
// python/hetseq/data.py's Plan.record and Plan.replan gather the fitted costs over the ranks and apply the split.

#include <utility>
#include <vector>

#include "bindings.h"
#include "hetseq/balance/cost_window.h"
#include "hetseq/balance/split_solver.h"

namespace py = pybind11;

namespace hetseq::python {

void bind_balance(py::module_& m) {
  py::class_<CostWindow>(m, "CostWindow", "The last `capacity` compute measurements of one rank")
      .def(py::init<size_t>(), py::arg("capacity"))
      .def(
          "add",
          [](CostWindow& w, int64_t samples, int64_t micro_batches, double seconds) {
            w.add(CostSample{samples, micro_batches, seconds});
          },
          py::arg("samples"), py::arg("micro_batches"), py::arg("seconds"))
      .def("__len__", &CostWindow::size)
      .def(
          "fit",
          [](const CostWindow& w) {
            const RankCost c = w.fit();
            return std::make_pair(c.fixed_s, c.per_sample_s);
          },
          "(fixed_s, per_sample_s): seconds of a micro-batch = fixed_s + per_sample_s * samples")
      .def("relative_error", &CostWindow::relative_error);
  m.def(
      "solve_split",
      [](int64_t samples_per_update, const std::vector<std::pair<double, double>>& costs, std::vector<int64_t> caps,
         int64_t multiple, const std::vector<int64_t>& current, double threshold) {
        SplitProblem problem;
        problem.samples_per_update = samples_per_update;
        for (const auto& [fixed_s, per_sample_s] : costs) problem.costs.push_back(RankCost{fixed_s, per_sample_s});
        problem.caps = caps.empty() ? std::vector<int64_t>(costs.size(), 0) : std::move(caps);
        problem.multiple = multiple;
        const Split split = solve_split(problem);
        const bool worth = current.empty() || worth_switching(problem, current, split, threshold);
        return py::make_tuple(split.shares, split.micro_batches, split.predicted_step_s, worth);
      },
      "The split of `samples_per_update` with equal predicted finish times for the ranks' `costs` [(fixed_s, "
      "per_sample_s)]: (shares, micro_batches, predicted_step_s, worth), `worth` whether it is predicted faster "
      "than `current` by more than `threshold`",
      py::arg("samples_per_update"), py::arg("costs"), py::arg("caps") = std::vector<int64_t>{},
      py::arg("multiple") = 1, py::arg("current") = std::vector<int64_t>{}, py::arg("threshold") = 0.0);
}

}  // namespace hetseq::python
