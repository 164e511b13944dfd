#include "support/sharded_state.h"

#include <set>
#include <stdexcept>
#include <vector>

#include "hetseq/core/format.h"

namespace hetseq::test {

std::map<std::string, torch::Tensor> gather_sharded_state(const hetseq::ShardedOptimizer& optimizer,
                                                          const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  torch::NoGradGuard no_grad;
  const optim::StatePiece mine = optimizer.state_piece();
  const auto& params = optimizer.params();
  const auto& plan = optimizer.plan();  // [rank]
  const int64_t world = group->getSize(), rank = group->getRank();
  // The buffer names, from this rank's piece ("param.{i}.{name}"); every rank must hold the same ones.
  std::set<std::string> names;
  for (const auto& [key, t] : mine.state) {
    const std::string rest = key.substr(key.find('.', 6) + 1);
    if (rest != "step") names.insert(rest);
  }
  std::vector<torch::Tensor> in{torch::tensor({static_cast<int64_t>(names.size())}, torch::kInt64)};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int64_t r = 0; r < world; ++r) out[0].push_back(torch::empty({1}, torch::kInt64));
  group->allgather(out, in)->wait();
  for (int64_t r = 0; r < world; ++r) {
    if (out[0][static_cast<size_t>(r)].item<int64_t>() != static_cast<int64_t>(names.size())) {
      throw std::runtime_error(fmt::format("rank {} holds {} optimizer buffers per parameter, rank {} holds {}", r,
                                           out[0][static_cast<size_t>(r)].item<int64_t>(), rank, names.size()));
    }
  }
  std::vector<int64_t> numels;  // [param]
  for (const auto& p : params) numels.push_back(p.numel());
  const auto value_options = params[0].options().dtype(torch::kFloat32);
  const auto count_options = torch::TensorOptions().dtype(torch::kInt64).device(params[0].device());
  std::map<std::string, torch::Tensor> full;  // [buffer name] flat over all parameters
  for (const auto& name : names) full[name] = torch::zeros({plan.back().first + plan.back().numel}, value_options);
  std::vector<int64_t> steps(params.size(), 0);  // [param]
  for (int64_t r = 0; r < world; ++r) {
    const ShardRange range = plan[static_cast<size_t>(r)];
    const auto slices = shard_slices(numels, range);
    const auto n = static_cast<int64_t>(slices.size());
    // The rank's buffers side by side ([name][element of its shard]), then its slices' update counts.
    torch::Tensor values = torch::zeros({static_cast<int64_t>(names.size()), range.numel}, value_options);
    torch::Tensor counts = torch::zeros({n}, count_options);
    if (r == rank) {
      int64_t at = 0;
      for (int64_t k = 0; k < n; ++k) {
        const size_t i = slices[static_cast<size_t>(k)].param;
        const auto step = mine.state.find(fmt::format("param.{}.step", i));
        if (step != mine.state.end()) counts[k] = step->second.item<int64_t>();
        int64_t row = 0;
        for (const auto& name : names) {
          const auto b = mine.state.find(fmt::format("param.{}.{}", i, name));
          if (b != mine.state.end()) {
            values[row].narrow(0, at, slices[static_cast<size_t>(k)].numel).copy_(b->second.reshape({-1}));
          }
          ++row;
        }
        at += slices[static_cast<size_t>(k)].numel;
      }
    }
    for (torch::Tensor& t : std::vector<torch::Tensor>{values, counts}) {
      std::vector<torch::Tensor> one{t};
      c10d::BroadcastOptions options;
      options.rootRank = r;
      group->broadcast(one, options)->wait();
    }
    int64_t row = 0;
    for (const auto& name : names) full[name].narrow(0, range.first, range.numel).copy_(values[row++]);
    const torch::Tensor c = counts.cpu();
    for (int64_t k = 0; k < n; ++k) {
      const size_t i = slices[static_cast<size_t>(k)].param;
      steps[i] = std::max(steps[i], c[k].item<int64_t>());
    }
  }
  std::map<std::string, torch::Tensor> state = optimizer.state();  // lr, num_steps, num_params
  int64_t start = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (steps[i] > 0) {
      state[fmt::format("param.{}.step", i)] = torch::scalar_tensor(steps[i], torch::kInt64);
      for (const auto& name : names) {
        state[fmt::format("param.{}.{}", i, name)] =
            full[name].narrow(0, start, numels[i]).view(params[i].sizes()).to(params[i].scalar_type());
      }
    }
    start += numels[i];
  }
  return state;
}

}  // namespace hetseq::test
