"""hetseq from Python: exact heterogeneous data parallelism for a Python training loop.

The gradients of an update are summed over the ranks and divided by the update's samples over all ranks, so
that ranks with different batch sizes train the model of one process on their concatenated batch.
"""
import contextlib

import torch
import torch.distributed as dist

from . import _C
from . import _world_defaults  # noqa: F401  (before any group exists: Note [Process groups at exit])
from . import _holders
from . import checkpoint  # noqa: F401  (hetseq.checkpoint.save, load)
from . import data  # noqa: F401  (hetseq.data.Plan)
from .session import train  # noqa: F401  (hetseq.train)
from .shard import ShardedOptimizer  # noqa: F401  (hetseq.ShardedOptimizer)

__version__ = _C.__version__
UsageError, InputError, PeerError = _C.UsageError, _C.InputError, _C.PeerError

if torch.__version__.split("+")[0] != _C.torch_version.split("+")[0]:
    raise ImportError(f"hetseq was built against torch {_C.torch_version}, and this is torch {torch.__version__}: "
                      "rebuild it against this torch (pip install --no-build-isolation .)")


# What a collective raises when a peer is gone: c10d's own error types, or, from Gloo's transport inside autograd's
# hooks, a RuntimeError whose text names the transport's failure.
_PEER_FAILURE_TEXTS = ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "Socket closed",
                       "Timed out waiting", "Broken pipe", "Connection refused")


def _peer_failure(e):
    """`e` as a hetseq.PeerError when it says that a peer was lost, else None."""
    if isinstance(e, _C.PeerError):
        return None  # already one
    lost = isinstance(e, getattr(dist, "DistError", ())) or (
        isinstance(e, RuntimeError) and (_C.peer_failure_seen() or any(t in str(e) for t in _PEER_FAILURE_TEXTS)))
    if not lost:
        return None
    return _C.PeerError(f"a collective of the update failed, a peer was lost (it died, was stopped, or hangs past "
                        f"the process group's timeout): {str(e).splitlines()[0][:300]}")


class _Update:
    def __init__(self, reducer, count, params):
        self._reducer, self._count, self._index, self.samples = reducer, count, 0, 0
        self._params = params

    def backward(self, loss_sum, sample_size):
        """Backward of one micro-batch's summed loss (not its mean) over `sample_size` samples."""
        if self._index >= self._count:
            raise _C.UsageError(f"backward called {self._index + 1} times in an update of {self._count} micro-batches")
        self._reducer.before_backward(self._index, self._count, loss_sum)
        loss_sum.backward()
        self._index += 1
        self.samples += sample_size

    def skip(self):
        """An empty micro-batch (a rank whose update has fewer): a backward of zero, so that every rank runs
        the same number and the gradients' hooks fire; it adds no sample."""
        self.backward(sum((p * 0).sum() for p in self._params), 0)


class DistributedDataParallel:
    """Wraps `module` (a torch.nn.Module) for exact sample-weighted data parallelism over `process_group`
    (default: the default group). Every rank must construct it at the same point."""

    def __init__(self, module, process_group=None, bucket_cap_mb=25.0, broadcast_buffers=True, shared_memory="auto",
                 timeout_s=300.0, seed=None):
        """`seed`: where given, every update reseeds torch's generators from (seed, update count, rank), as
        hetseq-train does, so that dropout draws depend on nothing before the update and a run resumed from a
        checkpoint draws what the run never stopped drew (Note [Resume from Python], hetseq/checkpoint.py)."""
        self.process_group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self.rank = dist.get_rank(self.process_group)
        self.module = module
        self.seed = seed
        self.num_updates = 0
        self._options = (bucket_cap_mb, broadcast_buffers, shared_memory, timeout_s)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._reducer = None
        self._build_reducer([])
        self.total_samples = 0
        self._unfinished = None  # why the last update did not finish (an exception in its body), until recover()
        _holders.holding.add(self)

    def _drop_group(self):
        # The C++ object is deleted with the GIL released; the group goes too, so that one the script destroyed
        # is joined now (Note [Process groups at exit]).
        self._reducer = None
        self.process_group = None

    def _build_reducer(self, initial_buckets):
        """(Re)builds the C++ reducer; every rank calls it at the same point (it broadcasts rank 0's tensors).
        `initial_buckets`: a checkpoint's bucket layout, so that a resumed run sums in the same order."""
        self._reducer = None  # the old one's hooks and shared memory go first
        params = list(self.module.named_parameters())
        buffers = list(self.module.named_buffers())
        self._reducer = _C.Reducer(params, buffers, self.process_group, *self._options, initial_buckets)

    @contextlib.contextmanager
    def update(self, micro_batches=1, samples=None):
        """One update of `micro_batches` backward passes (the same number on every rank). On leaving, every
        gradient is the sum over the ranks divided by the update's samples over all ranks. `samples`, this
        rank's samples in the update where known beforehand (a Plan's update: sum of its lengths), lets their
        sum over the ranks travel during the backward passes; it must equal the backward calls' sample_size.

        An exception in the body (or in the reduction) goes on to the caller and leaves the update unfinished:
        this rank may have started collectives that the other ranks have not. The next update() then raises a
        hetseq.UsageError that says so, until every rank calls recover() at the same point."""
        if self._unfinished is not None:
            raise _C.UsageError(f"update {self.num_updates + 1} cannot start: the previous one ended with an "
                                f"exception ({self._unfinished}) before its gradients were reduced, so this rank may "
                                "be out of step with the others. Call recover() on every rank at the same point "
                                "(it rebuilds the reduction from rank 0's parameters and buffers), or restart from a "
                                "checkpoint")
        if self.seed is not None:
            torch.manual_seed(_C.update_seed(self.seed, self.num_updates, self.rank))
        try:
            self._reducer.before_forward()
            if samples is not None:
                self._reducer.start_samples(float(samples))
            u = _Update(self._reducer, micro_batches, self._params)
            yield u
            if u._index != micro_batches:
                raise _C.UsageError(f"an update of {micro_batches} micro-batches ran {u._index} backward passes")
            if samples is not None and samples != u.samples:
                raise _C.UsageError(f"update(samples={samples}) but the backward passes counted {u.samples} samples")
            self.total_samples = self._reducer.finish_update(float(u.samples))
        except BaseException as e:
            self._unfinished = f"{type(e).__name__}: {e}".splitlines()[0][:300] if str(e) else type(e).__name__
            peer = _peer_failure(e)
            if peer is not None:
                raise peer from e
            raise
        self.num_updates += 1
        _holders.finished_updates += 1

    def recover(self):
        """After an update that ended with an exception (see update()): every rank calls it at the same point.
        Drops the unfinished update's gradients and reduction, and rebuilds the reduction with the bucket
        layout in force, which broadcasts rank 0's parameters and buffers; the update count stays (the
        unfinished update did not count). The next update() then starts afresh on every rank."""
        layout = self.bucket_layout
        for p in self._params:
            p.grad = None
        self._build_reducer(layout)
        self._unfinished = None

    @property
    def bucket_layout(self):
        """The gradient buckets' parameter indices in force, [bucket][parameter]; a checkpoint keeps it."""
        return self._reducer.bucket_layout

    @property
    def gradients_in_shared_memory(self):
        return self._reducer.gradients_in_shared_memory

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)
