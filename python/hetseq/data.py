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
        self._rank = None      # the rank whose updates were last handed out: its position is the plan's
        self._restored = None  # (epoch, offset) from a checkpoint, for the rank plans made after restore()
        self.epoch = 1         # the epoch to train next: restore() sets it
        self._plan(0)  # checks the sizes now: a hetseq.UsageError naming the flag's meaning

    @property
    def micro_batches(self):
        """Micro-batches in every rank's update: the most any rank runs (the others' last ones are empty)."""
        return max(self.update_freqs)

    def _plan(self, rank):
        if rank not in self._plans:
            self._plans[rank] = _C.Plan(self.dataset_size, self.batch_sizes, self.update_freqs, rank, self._seed,
                                        self._shuffle)
            if self._restored is not None:
                self._plans[rank].restore(*self._restored)
        return self._plans[rank]

    def updates(self, rank, epoch=None):
        """The updates of `epoch` (default: the plan's epoch, 1 unless restored) for `rank`: each a list of
        `micro_batches` index lists (some empty). After restore(), the restored epoch starts where it stopped."""
        epoch = self.epoch if epoch is None else epoch
        plan = self._plan(rank)
        self._rank = rank
        plan.begin_epoch(epoch)
        while not plan.end_of_epoch():
            update = plan.next_update()
            yield update + [[]] * (self.micro_batches - len(update))

    def updates_per_epoch(self, rank=0):
        return self._plan(rank).updates_per_epoch()

    def position(self):
        """(epoch, offset): where the next update starts, the samples of that epoch's permutation that the
        updates handed out so far consumed over all ranks (Note [Data plan]); (epoch + 1, 0) after an
        epoch's last update. A checkpoint keeps it."""
        if self._rank is None:
            return self._restored or (self.epoch, 0)
        epoch, offset = self._plan(self._rank).position()
        return (epoch + 1, 0) if offset >= self.dataset_size else (epoch, offset)

    def restore(self, epoch, offset):
        """Continues from a checkpoint's position: updates(rank, epoch) then starts at `offset`, and `epoch`
        becomes the plan's epoch. A hetseq.InputError when the offset lies outside the dataset."""
        for plan in self._plans.values():
            plan.restore(epoch, offset)
        if not self._plans:
            _C.Plan(self.dataset_size, self.batch_sizes, self.update_freqs, 0, self._seed, self._shuffle).restore(
                epoch, offset)  # checks it now
        self._restored, self.epoch = (epoch, offset), epoch
