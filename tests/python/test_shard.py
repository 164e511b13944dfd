"""hetseq.ShardedOptimizer, hetseq-train's --zero-sharding os for a Python loop, as real ranks under torchrun (one
launch of shard_worker.py serves the checks over ranks): with budgets 1:1:2 and unequal batches, Adam, AdamW and
SGD with momentum give the unsharded optimizer's weights bit for bit while each rank holds state for its share of
the parameters; a sharded run stopped and resumed, as it was, on other budgets or unsharded, ends with the weights
of the run never stopped, and its checkpoint is the unsharded run's; a budget <= 0 is an InputError naming the
rank, and an optimizer whose state is not per element a UsageError naming it."""
import os
import sys

import pytest
import torch

import hetseq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks import torchrun  # noqa: E402

BUDGETS = [1, 1, 2]  # shard_worker.py's, in proportion
ALIGNMENT = 16


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("shard")
    torchrun(3, os.path.join(HERE, "shard_worker.py"), out)
    return [torch.load(out / f"rank{r}.pt") for r in range(3)]


def assert_equal_weights(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"{what}, parameter {i}: differs by {(x - y).abs().max().item():.3g}"


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_a_sharded_optimizer_gives_the_unsharded_weights_bit_for_bit(ranks, name):
    for r, result in enumerate(ranks):
        run = result["exact"][name]
        assert run["updates"] == 7  # 300 samples, 49 an update: the last one short
        assert_equal_weights(run["sharded"], run["unsharded"], f"{name}, rank {r}")


@pytest.mark.parametrize("name,buffers", [("Adam", 2), ("AdamW", 2), ("SGD", 1)])
def test_each_rank_holds_state_for_its_share_of_the_parameters(ranks, name, buffers):
    report = ranks[0]["exact"][name]["report"]
    assert report == ranks[2]["exact"][name]["report"]  # every rank has every rank's line
    total = sum(p.numel() for p in ranks[0]["exact"][name]["sharded"])
    assert [line["rank"] for line in report] == [0, 1, 2]
    assert report[0]["first"] == 0 and report[-1]["first"] + report[-1]["numel"] == total
    assert all(a["first"] + a["numel"] == b["first"] for a, b in zip(report, report[1:]))
    assert [line["budget_bytes"] for line in report] == [b << 20 for b in BUDGETS]
    for line, budget in zip(report, BUDGETS):
        share = total * budget / sum(BUDGETS)
        assert abs(line["numel"] - share) <= ALIGNMENT, report
        assert line["state_bytes"] == line["numel"] * 4 * buffers, report  # float32 moments or momentum
        assert line["param_bytes"] == line["grad_bytes"] == total * 4


def test_a_resumed_sharded_run_ends_with_the_weights_of_the_run_never_stopped(ranks):
    for r, result in enumerate(ranks):
        runs = result["resume"]
        full, updates = runs["full"]
        assert updates == 14 and runs["stop"][1] == 10
        assert any(not torch.equal(a, b) for a, b in zip(runs["stop"][0], full))
        for mode in ("resume", "resume_other_budgets", "resume_unsharded"):
            assert runs[mode][1] == 14
            assert_equal_weights(runs[mode][0], full, f"{mode}, rank {r}")


def test_a_sharded_checkpoint_is_the_unsharded_runs(ranks):
    name, options, state = ranks[0]["resume"]["sharded_file"]
    unsharded_name, unsharded_options, unsharded_state = ranks[0]["resume"]["unsharded_file"]
    assert name == unsharded_name == "torch.optim.Adam" and options == unsharded_options
    assert sorted(state) == sorted(unsharded_state) and "param.0.exp_avg" in state
    for key in state:
        a, b = state[key], unsharded_state[key]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{key}: {a.dtype} {a.shape}, unsharded {b.dtype} {b.shape}"
        assert torch.equal(a, b), f"{key}: differs by {(a.double() - b.double()).abs().max().item():.3g}"


def test_a_budget_of_zero_is_an_input_error_naming_the_rank_on_every_rank(ranks):
    for result in ranks:
        # The keyword, not hetseq-train's --memory-budget (Note [Options in the user's words]).
        assert result["budget_error"].startswith("hetseq.ShardedOptimizer: memory_budget: rank 1 has a budget of 0 "
                                                 "bytes"), result["budget_error"]
        assert "--" not in result["budget_error"], result["budget_error"]


def test_a_param_group_added_afterwards_is_a_usage_error(ranks):
    for result in ranks:
        assert "add_param_group after it was built" in result["add_param_group_error"]


class _Adam(torch.optim.Adam):
    pass


@pytest.mark.parametrize("cls", [torch.optim.LBFGS, torch.optim.Adafactor, torch.optim.SparseAdam, _Adam])
def test_an_optimizer_whose_state_is_not_per_element_is_a_usage_error_naming_it(cls):
    name = "torch.optim." + cls.__qualname__ if cls is not _Adam else "test_shard._Adam"
    with pytest.raises(hetseq.UsageError, match=rf"hetseq.ShardedOptimizer: {name} is not known to "
                                                r"keep its state per element.*use one of SGD, Adam, AdamW"):
        hetseq.ShardedOptimizer(cls, [torch.nn.Parameter(torch.zeros(4))], memory_budget=1 << 20)
