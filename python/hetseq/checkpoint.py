"""Checkpoints of a Python training loop in hetseq-train's format (its Note [Checkpoint file]), written and read
by the library's own writer and reader: hetseq-eval evaluates them, torch.load(path, weights_only=True) reads
them, and hetseq.checkpoint.load continues the loop exactly where it stopped.

Note [Resume from Python]
~~~~~~~~~~~~~~~~~~~~~~~~~
A run stopped after update k and resumed from its checkpoint ends with the weights of the run never stopped, bit
for bit, when the resumed run sees, update by update, the same numbers:
- the weights and buffers (the file's `model`);
- the optimizer's state (`optimizer`): see Note [torch.optim state in a hetseq checkpoint];
- the LR scheduler's state (`lr_scheduler`), its numbers: see _numbers;
- the data plan's position (`extra_state.epoch`, `offset`): the next update takes the next samples of the same
  epoch's permutation, whatever the ranks' batch sizes (Note [Data plan]); and the balanced split in force
  (`data_plan.shares`, Plan.replan), taken back where the plan has as many ranks and samples per update;
- the update count (`num_updates`), from which DistributedDataParallel(seed=...) reseeds torch's generators at
  every update from (seed, update, rank) as hetseq-train does: dropout inside an update then draws what it drew
  in the run never stopped, on every rank. The file also keeps rank 0's CPU generator state (and its CUDA
  ones), which every rank takes back on load, for what is drawn between updates; a loop that draws inside its
  updates without `seed` resumes exactly on rank 0 only. Python's `random` and NumPy's generators are the
  loop's own: a checkpoint does not hold them;
- the gradient buckets' layout (`bucket_layout`): with three or more ranks Gloo's ring adds an element's values
  in an order that depends on its place in its bucket (Note [Bucketed reduction]), so load rebuilds the reducer
  on the saved layout when it differs.

Note [torch.optim state in a hetseq checkpoint]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A torch.optim optimizer is named `torch.optim.<class>` (hetseq-train's own are `adam`, `sgd`, ..., so neither
takes the other's state by mistake). Its param groups' numbers are `optimizer.options`: `lr`, `eps`, a tuple as
`betas.0`, `betas.1`, a bool as 0 or 1, prefixed `group<g>.` when there are several groups; strings and None are
not numbers and stay as the loop builds them. `optimizer.state` holds, as in hetseq's own Note [Optimizer state],
`num_params` and `param.<i>.<name>` for every tensor of parameter i's state (`step`, `exp_avg`, `momentum_buffer`,
...), with torch's dtypes, so that load gives torch.optim back the tensors it saved. A hetseq.ShardedOptimizer is
saved in the unsharded form, under its class's name: the file of the unsharded run (Note [Sharded torch.optim
optimizers], hetseq/shard.py).
"""
import numbers

import torch

from . import _C
from .shard import ShardedOptimizer, class_path


def save(path, ddp, optimizer=None, plan=None, lr_scheduler=None, task="python", options=""):
    """Writes the loop's state to `path` in hetseq-train's checkpoint format. Every rank of `ddp`'s group calls it
    at the same point, between updates; rank 0 writes the file atomically (a temporary file renamed over `path`:
    never half-written) and the others wait for it. A hetseq.InputError where rank 0 cannot write it, a
    hetseq.PeerError on the other ranks then. `task` and `options` are kept for the record (the file's `args`)."""
    # Every rank: a hetseq.ShardedOptimizer's state_dict() gathers its shards.
    optimizer_state = optimizer.state_dict() if optimizer is not None else None
    error = None
    if ddp.rank == 0:
        try:
            _C.save_checkpoint(_checkpoint(ddp, optimizer, optimizer_state, plan, lr_scheduler, task, options),
                               str(path))
        except Exception as e:  # every rank must reach the all_reduce below
            error = e
    failed = _C.any_rank(error is not None, ddp.process_group)  # a tensor of C++'s: Note [Process groups at exit]
    if error is not None:
        raise error
    if failed:
        raise _C.PeerError(f"rank 0 could not write the checkpoint {path}; its error says why")


def load(path, ddp, optimizer=None, plan=None, lr_scheduler=None):
    """Continues from the checkpoint at `path`: the model's weights and buffers, the optimizer's and scheduler's
    state, the plan's position (plan.epoch and the next update), the update count and the generators, and the
    bucket layout. Every rank calls it at the same point, before the next update. Returns the file's contents
    (hetseq._C.Checkpoint). A hetseq.InputError naming the file when it is damaged, not a checkpoint, or of
    another model or optimizer, and then nothing is changed."""
    c = _C.load_checkpoint(str(path))
    if optimizer is not None:
        optimizer_state = _optimizer_state_dict(optimizer, c, str(path))  # checked before anything changes
    if lr_scheduler is not None:
        scheduler_state = _scheduler_state_dict(lr_scheduler, c, str(path))
    _C.load_model(*_named_tensors(ddp.module), c, str(path))
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    if lr_scheduler is not None:
        lr_scheduler.load_state_dict(scheduler_state)
    if plan is not None:
        if c.shares and len(c.shares) == len(plan.batch_sizes) and sum(c.shares) == plan.samples_per_update():
            plan.set_shares(c.shares, c.update_freqs)  # the balanced split in force, on the same ranks
        plan.restore(c.epoch, c.offset)
    ddp.num_updates = c.num_updates
    if c.rng_state is not None:
        torch.set_rng_state(c.rng_state)
    if c.cuda_rng_states and torch.cuda.is_available():
        for device, state in enumerate(c.cuda_rng_states[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    if c.bucket_layout and c.bucket_layout != ddp.bucket_layout:
        ddp._build_reducer(c.bucket_layout)
    return c


def _named_tensors(module):
    return list(module.named_parameters()), list(module.named_buffers())


def _checkpoint(ddp, optimizer, optimizer_state, plan, lr_scheduler, task, options):
    parameters, buffers = _named_tensors(ddp.module)
    c = _C.Checkpoint()
    c.model = [(name, t.detach().to("cpu", copy=True)) for name, t in parameters + buffers]
    c.model_digest = _C.model_digest(parameters, buffers)
    c.task, c.options = task, options
    if optimizer is not None:
        c.optimizer_name, c.optimizer_options, c.optimizer_state = _optimizer_entries(optimizer, optimizer_state)
    if lr_scheduler is not None:
        c.lr_scheduler_name = _class_name(lr_scheduler)
        c.lr_scheduler_state = dict(_numbers(lr_scheduler.state_dict()))
    c.num_updates = ddp.num_updates
    if plan is not None:
        c.epoch, c.offset = plan.position()
        c.batch_sizes, c.update_freqs = plan.batch_sizes, plan.update_freqs
        c.shares = plan.shares or []
    c.rng_state = torch.get_rng_state()
    if torch.cuda.is_available():
        c.cuda_rng_states = torch.cuda.get_rng_state_all()
    c.bucket_layout = ddp.bucket_layout
    return c


def _class_name(obj):
    """`torch.optim.Adam`, `torch.optim.lr_scheduler.StepLR`; `module.Class` for others; a ShardedOptimizer's
    class's name."""
    return class_path(obj.optimizer_class if isinstance(obj, ShardedOptimizer) else type(obj))


def _numbers(d, prefix=""):
    """The numbers of a state dict as (dotted key, float) pairs: ints, floats, bools, and lists, tuples and dicts
    of them; other values (strings, None, functions) are the loop's to rebuild and are left out."""
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            yield name, float(value)
        elif isinstance(value, numbers.Real):
            yield name, float(value)
        elif isinstance(value, (list, tuple)):
            yield from _numbers(dict(enumerate(value)), name + ".")
        elif isinstance(value, dict):
            yield from _numbers(value, name + ".")


def _with_numbers(d, saved, prefix, source, what):
    """`d` (a live state dict) with its numbers taken from `saved` (what _numbers gave), in their own types."""
    def put(key, value):
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            return bool(_saved(name))
        if isinstance(value, numbers.Integral):
            return int(_saved(name))
        if isinstance(value, numbers.Real):
            return _saved(name)
        if isinstance(value, (list, tuple)):
            return type(value)(_with_numbers(dict(enumerate(value)), saved, name + ".", source, what).values())
        if isinstance(value, dict):
            return _with_numbers(value, saved, name + ".", source, what)
        return value

    def _saved(name):
        if name not in saved:
            raise _C.InputError(f"{source}: the {what} has no entry '{name}'; was it saved with another {what}?")
        return saved[name]

    return {key: put(key, value) for key, value in d.items()}


def _optimizer_entries(optimizer, sd):
    """(name, options, state) of a torch.optim optimizer of state dict `sd`; see Note [torch.optim state in a hetseq
    checkpoint]."""
    groups = sd["param_groups"]
    options = {}
    for g, group in enumerate(groups):
        numbers_of_group = {k: v for k, v in group.items() if k != "params"}
        options.update(_numbers(numbers_of_group, "" if len(groups) == 1 else f"group{g}."))
    state = {"num_params": torch.tensor(sum(len(group["params"]) for group in groups))}
    for i, entries in sd["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                state[f"param.{i}.{key}"] = value.detach().to("cpu", copy=True)
            elif value is not None:
                raise _C.UsageError(f"hetseq.checkpoint.save: the optimizer's state '{key}' of parameter {i} is a "
                                    f"{type(value).__name__}; a checkpoint keeps tensors only")
    return _class_name(optimizer), options, state


def _optimizer_state_dict(optimizer, c, source):
    """The state dict that gives `optimizer` the checkpoint's state, checked against the optimizer's kind and
    parameters before anything changes (a collective for a ShardedOptimizer, whose state_dict() gathers)."""
    name = _class_name(optimizer)
    if c.optimizer_name != name:
        raise _C.InputError(f"{source}: its optimizer is {c.optimizer_name or '(none)'}, and this loop's is {name}; "
                            "build the optimizer the checkpoint was saved with")
    sd = optimizer.state_dict()
    groups = sd["param_groups"]
    sd["param_groups"] = [
        dict(_with_numbers({k: v for k, v in group.items() if k != "params"}, c.optimizer_options,
                           "" if len(groups) == 1 else f"group{g}.", source, "optimizer"), params=group["params"])
        for g, group in enumerate(groups)]
    if c.optimizer_state is None:
        return sd
    count = sum(len(group["params"]) for group in groups)
    saved = c.optimizer_state
    if int(saved.get("num_params", torch.tensor(-1))) != count:
        raise _C.InputError(f"{source}: its optimizer state is for {int(saved.get('num_params', torch.tensor(-1)))} "
                            f"parameters, and this optimizer has {count}; was it saved from another model?")
    state = {}
    for key, value in saved.items():
        if key.startswith("param."):
            i, name = key[len("param."):].split(".", 1)
            state.setdefault(int(i), {})[name] = value
    sd["state"] = state
    return sd


def _scheduler_state_dict(lr_scheduler, c, source):
    name = _class_name(lr_scheduler)
    if c.lr_scheduler_name != name:
        raise _C.InputError(f"{source}: its LR scheduler is {c.lr_scheduler_name or '(none)'}, and this loop's is "
                            f"{name}; build the scheduler the checkpoint was saved with")
    return _with_numbers(lr_scheduler.state_dict(), c.lr_scheduler_state, "", source, "LR scheduler")
