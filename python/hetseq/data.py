"""The per-rank data plan of hetseq (its Note [Data plan]): each update, the sample indices of this rank's
micro-batches, every sample of an epoch once across the ranks, whatever the batch sizes."""
from . import _C


class Plan:
    """Ranks with batch sizes `batch_sizes` ([rank]) and `update_freqs` micro-batches per update (default 1 each)
    over `dataset_size` samples, in the order that hetseq-train draws from `seed`."""

    def __init__(self, dataset_size, batch_sizes, update_freqs=None, seed=1, shuffle=True):
        self.dataset_size, self.batch_sizes = dataset_size, list(batch_sizes)
        self.update_freqs = list(update_freqs) if update_freqs else [1] * len(self.batch_sizes)
        self._seed, self._shuffle = seed, shuffle
        self._plans = {}
        self._plan(0)  # checks the sizes now: a hetseq.UsageError naming the flag's meaning

    @property
    def micro_batches(self):
        """Micro-batches in every rank's update: the most any rank runs (the others' last ones are empty)."""
        return max(self.update_freqs)

    def _plan(self, rank):
        if rank not in self._plans:
            self._plans[rank] = _C.Plan(self.dataset_size, self.batch_sizes, self.update_freqs, rank, self._seed,
                                        self._shuffle)
        return self._plans[rank]

    def updates(self, rank, epoch=1):
        """The updates of `epoch` for `rank`: each a list of `micro_batches` index lists (some empty)."""
        plan = self._plan(rank)
        plan.begin_epoch(epoch)
        while not plan.end_of_epoch():
            update = plan.next_update()
            yield update + [[]] * (self.micro_batches - len(update))

    def updates_per_epoch(self, rank=0):
        return self._plan(rank).updates_per_epoch()
