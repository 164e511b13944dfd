"""The per-rank data plan of hetseq (its Note [Data plan]): each update, the sample indices of this rank's
micro-batches, every sample of an epoch once across the ranks, whatever the batch sizes; and hetseq's balancer
(its Note [Balancing]), which moves samples between the ranks so that they finish their updates together."""
import torch
import torch.distributed as dist

from . import _C
from . import _holders


class Plan:
    """Ranks with batch sizes `batch_sizes` ([rank]) and `update_freqs` micro-batches per update (default 1 each)
    over `dataset_size` samples, in the order that hetseq-train draws from `seed`."""

    def __init__(self, dataset_size, batch_sizes, update_freqs=None, seed=1, shuffle=True, balance_window=10):
        """`balance_window`: the measurements per rank that record() keeps for replan()."""
        self.dataset_size, self.batch_sizes = dataset_size, list(batch_sizes)
        self.shares = None  # [rank] samples per update of a balanced split (replan); None: batch size x update freq
        self._window = _C.CostWindow(balance_window)
        self.update_freqs = list(update_freqs) if update_freqs else [1] * len(self.batch_sizes)
        self._seed, self._shuffle = seed, shuffle
        self._plans = {}
        self._rank = None      # the rank whose updates were last handed out: its position is the plan's
        self._handed = None    # (position before it, finished updates then) of the update last handed out
        self._restored = None  # (epoch, offset) from a checkpoint, for the rank plans made after restore()
        self.epoch = 1         # the epoch to train next: restore() sets it
        self._plan(0)  # checks the sizes now: a hetseq.UsageError naming batch_sizes or update_freqs

    @property
    def micro_batches(self):
        """Micro-batches in every rank's update: the most any rank runs (the others' last ones are empty)."""
        return max(self.update_freqs)

    def _plan(self, rank):
        if rank not in self._plans:
            self._plans[rank] = _C.Plan(self.dataset_size, self.batch_sizes, self.update_freqs, rank, self._seed,
                                        self._shuffle)
            if self.shares is not None:
                self._plans[rank].set_shares(self.shares, self.update_freqs)
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
            self._handed = (self._position_of(plan), _holders.finished_updates)
            update = plan.next_update()
            yield update + [[]] * (self.micro_batches - len(update))

    def updates_per_epoch(self, rank=0):
        return self._plan(rank).updates_per_epoch()

    def position(self):
        """(epoch, offset): where the next update to train starts: the samples of that epoch's permutation that
        the updates finished so far consumed over all ranks (Note [Data plan]); (epoch + 1, 0) after an epoch's
        last update. An update counts as finished once a hetseq.DistributedDataParallel update of this process
        ended after the plan handed it out: so a checkpoint saved at the top of a loop's body (the update handed
        out, not trained) and one saved at its bottom (trained) both resume at the first sample not trained.
        A checkpoint keeps it."""
        if self._rank is None:
            return self._restored or (self.epoch, 0)
        if self._handed is not None and _holders.finished_updates == self._handed[1]:
            return self._handed[0]  # the update last handed out is not trained yet
        return self._position_of(self._plan(self._rank))

    def _position_of(self, plan):
        epoch, offset = plan.position()
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

    def samples_per_update(self):
        """The samples of one update over all ranks (a balanced split moves them, never changes their number)."""
        return sum(self.shares) if self.shares is not None else sum(
            b * u for b, u in zip(self.batch_sizes, self.update_freqs))

    def set_shares(self, shares, micro_batches=None):
        """A balanced split from the next update on: rank r takes `shares[r]` samples per update, in
        `micro_batches[r]` micro-batches (default 1 each); the position in the epoch is kept."""
        micro_batches = list(micro_batches) if micro_batches else [1] * len(shares)
        for plan in self._plans.values():
            plan.set_shares(list(shares), micro_batches)
        self.shares, self.update_freqs = list(shares), micro_batches
        self.batch_sizes = [-(-s // m) for s, m in zip(self.shares, micro_batches)]

    def record(self, compute_s, samples, micro_batches=1):
        """A measurement of this rank's compute in one update: `samples` in `micro_batches` micro-batches took
        `compute_s` seconds (forward and backward; not the wait in collectives, nor the optimizer step)."""
        self._window.add(samples, micro_batches, compute_s)

    def replan(self, process_group=None, threshold=0.03, caps=None, multiple=1):
        """Every rank calls it at the same point between updates. Gathers every rank's cost fitted to its recorded
        measurements, solves for the split of the same samples per update with equal predicted finish times
        (largest micro-batch `caps` [rank], shares multiples of `multiple` where possible), and applies it when
        it is predicted faster than the split in force by more than `threshold` (a share of the step time).
        Every rank computes the same split from the same gathered figures. Returns the new shares, or None when
        the split stays (also while a rank has no measurement)."""
        world = dist.get_world_size(process_group)
        if world != len(self.batch_sizes):
            raise _C.UsageError(f"replan over {world} ranks, but the plan has batch sizes for {len(self.batch_sizes)}")
        local = torch.tensor(self._window.fit() if len(self._window) else (float("nan"), float("nan")),
                             dtype=torch.float64)
        gathered = [torch.empty(2, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(gathered, local, group=process_group)
        if any(torch.isnan(t).any() for t in gathered):
            return None
        current = self.shares or [b * u for b, u in zip(self.batch_sizes, self.update_freqs)]
        shares, micro_batches, _, worth = _C.solve_split(self.samples_per_update(), [tuple(t.tolist()) for t in gathered],
                                                         list(caps or []), multiple, current, threshold)
        if not worth or shares == current:
            return None
        self.set_shares(shares, micro_batches)
        return shares
