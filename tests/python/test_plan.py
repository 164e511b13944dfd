"""hetseq.data.Plan, the per-rank data plan of hetseq-train, from Python; and hetseq's errors as Python exceptions."""
import pytest

import hetseq


@pytest.mark.parametrize("batch_sizes,update_freqs", [([7, 13, 29], None), ([7, 13, 29], [1, 3, 2]), ([5], [2])])
def test_every_sample_of_an_epoch_once_across_the_ranks(batch_sizes, update_freqs):
    plan = hetseq.data.Plan(1000, batch_sizes, update_freqs, seed=5)
    for epoch in (1, 2):
        seen, counts = [], set()
        for rank in range(len(batch_sizes)):
            updates = list(plan.updates(rank, epoch))
            counts.add(len(updates))
            for update in updates:
                assert len(update) == plan.micro_batches
                for micro_batch in update:
                    seen += micro_batch
        assert counts == {plan.updates_per_epoch()}  # every rank runs the same number of updates
        assert sorted(seen) == list(range(1000))
    first = [i for u in plan.updates(0, 1) for mb in u for i in mb]
    second = [i for u in plan.updates(0, 2) for mb in u for i in mb]
    assert first != second  # each epoch has its own order


def test_a_usage_error_arrives_as_hetseq_usage_error():
    with pytest.raises(hetseq.UsageError, match="^batch_sizes: rank 0 has batch size 0"):
        hetseq.data.Plan(100, [0, 4])
    assert issubclass(hetseq.UsageError, ValueError)
