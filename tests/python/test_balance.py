"""hetseq's balancer from Python: the split solver's shares for given costs, and Plan.record / Plan.replan over
real ranks under torchrun, moving samples to the faster rank while every sample of the epoch is still used once."""
import os

import torch

import hetseq
from ranks import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_split_solver_gives_equal_finish_times():
    # 64 samples an update, rank 1 three times slower a sample: 48 and 16 finish together (48 ms each).
    shares, micro_batches, predicted_s, worth = hetseq._C.solve_split(64, [(0.0, 0.001), (0.0, 0.003)],
                                                                     current=[24, 40], threshold=0.03)
    assert shares == [48, 16] and micro_batches == [1, 1] and worth
    assert abs(predicted_s - 0.048) < 1e-12
    # A cap of 32 samples a micro-batch on rank 0 cuts its 48 into two.
    shares, micro_batches, _, _ = hetseq._C.solve_split(64, [(0.0, 0.001), (0.0, 0.003)], caps=[32, 0])
    assert shares == [48, 16] and micro_batches == [2, 1]
    # Already balanced: not worth switching.
    assert hetseq._C.solve_split(64, [(0.0, 0.001), (0.0, 0.003)], current=[48, 16], threshold=0.03)[3] is False


def test_replan_moves_samples_to_the_faster_rank(tmp_path):
    torchrun(2, os.path.join(HERE, "balance_worker.py"), tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in ranks:
        assert r["shares"] == [48, 16]
        assert r["replans"][0] == [48, 16] and all(x is None for x in r["replans"][1:])  # once, then it holds
    assert len(ranks[0]["updates"]) == len(ranks[1]["updates"])
    sizes = [[len(u) for u in r["updates"]] for r in ranks]
    assert sizes[0][:4] == [24] * 4 and sizes[1][:4] == [40] * 4
    assert set(sizes[0][4:-1]) == {48} and set(sizes[1][4:-1]) == {16}
    seen = sorted(i for r in ranks for u in r["updates"] for i in u)
    assert seen == list(range(1000))  # every sample of the epoch once, across the split's change
