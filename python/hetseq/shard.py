"""hetseq.ShardedOptimizer: hetseq-train's --zero-sharding os for a Python loop. Each rank keeps a torch.optim
optimizer's state for a shard of the parameters only, sized in proportion to its memory budget, and the updated
shards are gathered to every rank after the step.

Note [Sharded torch.optim optimizers]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The cut and the gather are hetseq's own, bound from C++ (hetseq/shard, Note [Sharded optimizer state]): the ranks
exchange their budgets (exchange_budgets), every rank computes the same plan (plan_shards: the parameters laid end
to end in their param groups' order, cut in proportion to the budgets at multiples of `alignment` elements), and
its shard is a list of 1-D views narrowed out of the parameters' own storage (shard_slices, slice_views), as
hetseq-train cuts for the same budgets and alignment. The torch.optim optimizer of the class given is built over
these views, in param groups that mirror the user's, so that it allocates state for the shard only. step() gives
each view the same view of its parameter's reduced gradient, steps the shard's optimizer (updating the
parameters' storage in place) and gathers every rank's updated shard to every rank (ShardGather, Note [Gathering
uneven shards]), a copy of bits.

Exactness. The result equals the unsharded optimizer's bit for bit when the optimizer is elementwise: an
element's new value and state depend only on its own value, gradient and state and on numbers that every rank
shares (the group's options, the parameter's step count), and the kernels apply the same rounded operations to
each element whatever the tensor's length. Whether a class is elementwise cannot be read off its state: LAMB's
and LARS's state is shaped like the parameter, yet their step scales it by the parameter's norm, which a shard
would compute over its own elements only and get silently wrong; Adafactor's factored state and LBFGS's history
are not per element at all. So the classes are an allow-list, _ELEMENTWISE, each compared bit for bit with its
unsharded run by tests/python/test_shard.py; its subclasses are refused too (a subclass may change step). The
gradients are the reducer's, whole on every rank, as under hetseq-train's `os` (not os+grad).

State dicts and checkpoints. state_dict() is a collective that gives, on every rank, the unsharded form: what the
same class over all the parameters would give, the shards' state gathered with ShardGather. load_state_dict()
takes that form, from a sharded run of any world size, budgets or alignment, or from an unsharded run, and each
rank keeps its own shard's slices. hetseq.checkpoint.save therefore writes, under the class's own name
(`torch.optim.Adam`), the file that the unsharded run writes, bit for bit: hetseq-eval reads it, an unsharded loop
resumes from it, and a sharded one on any plan. The price is the whole state on every rank while saving, where
hetseq-train's sharded checkpoints write one shard file per rank (Note [Sharded optimizer state in checkpoints]).
"""
import numbers

import torch
import torch.distributed as dist

from . import _C
from . import _holders

_ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)  # See Note [Sharded torch.optim optimizers]
_SCALAR_STATE = ("step",)  # the state of theirs that is not per element: shared by every slice of a parameter


def _groups(params):
    """The user's param groups, as torch.optim reads its `params` argument: dicts with a list of tensors each."""
    if isinstance(params, torch.Tensor):
        params = [params]
    params = list(params)
    if not params:
        raise _C.UsageError("hetseq.ShardedOptimizer: got an empty parameter list")
    if not isinstance(params[0], dict):
        params = [{"params": params}]
    groups = []
    for g in params:
        g = dict(g)
        g["params"] = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
        groups.append(g)
    return groups


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_class` (torch.optim.SGD, Adam or AdamW) over `params` with its state sharded over the ranks of
    `process_group` (default: the default group) in proportion to each rank's `memory_budget` in bytes (default:
    the memory free on the parameters' device). Every rank constructs it at the same point (a collective), with
    the same parameters, which must be contiguous and of one dtype and device; `optimizer_kwargs` go to the class.
    The loop is the user's: zero_grad(), the update's backward passes (hetseq.DistributedDataParallel reduces the
    gradients on every rank), then step(), a collective. LR schedulers take it as any optimizer. See Note [Sharded
    torch.optim optimizers].

    A hetseq.UsageError naming the class for one whose state is not per element; a hetseq.InputError naming the
    rank, on every rank, for a budget <= 0 or too small for one `alignment`-element piece of the parameters."""

    def __init__(self, optimizer_class, params, memory_budget=None, process_group=None, alignment=16,
                 **optimizer_kwargs):
        if optimizer_class not in _ELEMENTWISE:
            name = class_path(optimizer_class) if isinstance(optimizer_class, type) else repr(optimizer_class)
            allowed = ", ".join(c.__name__ for c in _ELEMENTWISE)
            raise _C.UsageError(f"hetseq.ShardedOptimizer: {name} is not known to keep its state per element, so a "
                                f"shard of its parameters could not step as the whole does; use one of {allowed}, or "
                                "the unsharded optimizer")
        if memory_budget is not None and (isinstance(memory_budget, bool) or
                                          not isinstance(memory_budget, numbers.Integral)):
            raise _C.UsageError(f"hetseq.ShardedOptimizer: memory_budget is {memory_budget!r}; give bytes as an int, "
                                "or None for the free memory")
        groups = _groups(params)
        flat = [p for g in groups for p in g["params"]]  # [param] in the flat space's order
        for i, p in enumerate(flat):
            if not isinstance(p, torch.Tensor) or not p.is_contiguous() or p.dtype != flat[0].dtype or \
                    p.device != flat[0].device:
                raise _C.UsageError(f"hetseq.ShardedOptimizer: parameter {i} must be a contiguous tensor with "
                                    f"parameter 0's dtype and device ({flat[0].dtype}, {flat[0].device})")
        self.process_group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self.rank = dist.get_rank(self.process_group)
        self.optimizer_class = optimizer_class
        device = flat[0].device
        self.budget_bytes = int(memory_budget) if memory_budget is not None else _C.free_memory_bytes(device)
        budgets = _C.exchange_budgets(self.process_group, self.budget_bytes, device)  # [rank]
        try:
            plan = _C.plan_shards(budgets, sum(p.numel() for p in flat), alignment)
        except _C.InputError as e:
            raise _C.InputError(f"hetseq.ShardedOptimizer: {e}") from None  # e names memory_budget
        self._params = flat
        self._slices = _C.shard_slices([p.numel() for p in flat], plan[self.rank])  # [view]
        self._views = _C.slice_views(flat, self._slices)  # [view] the shard optimizer's parameters
        self._gather = _C.ShardGather(self.process_group, plan, flat)
        _holders.holding.add(self)
        # The shard optimizer's groups mirror the user's that have views in this shard: _inner_group[g].
        group_of = []  # [param] the user's group it is in
        for g, group in enumerate(groups):
            group_of += [g] * len(group["params"])
        self._inner_group = {}
        inner_groups = []
        for view, s in zip(self._views, self._slices):
            g = group_of[s.param]
            if g not in self._inner_group:
                self._inner_group[g] = len(inner_groups)
                inner_groups.append({**_options(groups[g]), "params": []})
            inner_groups[self._inner_group[g]]["params"].append(view)
        self.optimizer = optimizer_class(inner_groups, **optimizer_kwargs)
        self._built = False
        super().__init__(groups, self.optimizer.defaults)
        self._built = True

    def add_param_group(self, param_group):
        """torch.optim's, while it is built; afterwards a hetseq.UsageError: the plan cuts the parameters it was
        built with."""
        if self._built:
            raise _C.UsageError("hetseq.ShardedOptimizer: add_param_group after it was built would leave the new "
                                "parameters out of the shard plan; build it with every param group")
        super().add_param_group(param_group)

    @property
    def plan(self):
        """Every rank's shard of the flat parameter space, [rank] (hetseq._C.ShardRange: first, numel)."""
        return self._gather.plan

    @property
    def shard(self):
        """This rank's shard."""
        return self._gather.plan[self.rank]

    def _pass_options(self):
        """The user's groups' numbers (an LR scheduler's lr among them) to the shard optimizer's groups."""
        for g, j in self._inner_group.items():
            self.optimizer.param_groups[j].update(_options(self.param_groups[g]))

    @torch.no_grad()
    def step(self, closure=None):
        """Steps this rank's shard with the reduced gradients' slices, then gathers every rank's updated shard
        (a collective: every rank calls it). Returns the closure's loss, where given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._pass_options()
        for view, s in zip(self._views, self._slices):
            grad = self._params[s.param].grad
            view.grad = None if grad is None else grad.reshape(-1).narrow(0, s.offset, s.numel)
        try:
            self.optimizer.step()
        finally:
            for view in self._views:
                view.grad = None
        self._gather.gather()
        return loss

    def state_bytes(self):
        """Bytes of the optimizer state this rank holds: its shard's per-element state tensors."""
        return sum(t.nbytes for state in self.optimizer.state.values() for key, t in state.items()
                   if key not in _SCALAR_STATE and isinstance(t, torch.Tensor))

    def report(self, print_json=False):
        """A collective: every rank's shard as hetseq-train's `shard` records have it, [rank] of dicts with rank,
        first, numel, state_bytes, budget_bytes, param_bytes and grad_bytes (what the rank holds of each, read from
        the tensors allocated). With `print_json`, rank 0 also logs them and prints each as hetseq-train's JSON line
        {"tag":"shard",...} on stdout (print_shard_reports)."""
        mine = _C.ShardReport()
        mine.rank, mine.first, mine.numel = self.rank, self.shard.first, self.shard.numel
        mine.state_bytes, mine.budget_bytes = self.state_bytes(), self.budget_bytes
        mine.param_bytes = sum(p.nbytes for p in self._params)
        mine.grad_bytes = sum(p.grad.nbytes for p in self._params if p.grad is not None)
        reports = _C.exchange_shard_reports(self.process_group, mine, self._params[0].device)
        if print_json and self.rank == 0:
            _C.print_shard_reports(reports, True)
        fields = ("rank", "first", "numel", "state_bytes", "budget_bytes", "param_bytes", "grad_bytes")
        return [{f: getattr(r, f) for f in fields} for r in reports]

    def state_dict(self):
        """A collective: the state in the unsharded form, on every rank, as `optimizer_class` over all the parameters
        would give it (Note [Sharded torch.optim optimizers]): every rank's shard of each per-element state tensor
        gathered into a tensor shaped like its parameter."""
        inner_state = self.optimizer.state_dict()["state"]  # [view][key]
        mine = {}  # [param][key] this rank's non-element state, None for element state
        for k, state in inner_state.items():
            entries = mine.setdefault(self._slices[k].param, {})
            for key, value in state.items():
                entries[key] = value if key in _SCALAR_STATE or value is None else None
        every = [None] * dist.get_world_size(self.process_group)  # [rank]
        dist.all_gather_object(every, mine, group=self.process_group)
        state = {}  # [param][key]
        for per_rank in every:
            for i, entries in per_rank.items():
                for key, value in entries.items():
                    state.setdefault(i, {})[key] = value
        element_keys = sorted({key for entries in state.values() for key, v in entries.items() if v is None
                               and key not in _SCALAR_STATE})
        for key in element_keys:
            full = [torch.zeros_like(p) for p in self._params]  # [param]
            for k, s in enumerate(self._slices):
                t = inner_state.get(k, {}).get(key)
                if t is not None:
                    full[s.param].view(-1).narrow(0, s.offset, s.numel).copy_(t)
            _C.ShardGather(self.process_group, self.plan, full).gather()
            for i, entries in state.items():
                if key in entries:
                    entries[key] = full[i]
        sd = super().state_dict()  # the param groups, packed as torch.optim packs them
        sd["state"] = {i: state[i] for i in sorted(state)}
        return sd

    def load_state_dict(self, state_dict):
        """Takes the unsharded form (state_dict(), or an unsharded optimizer's of the same class, of any run): the
        groups' options, and this rank's slices of each per-element state tensor. A hetseq.InputError naming the
        parameter where a tensor's size is not its parameter's."""
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        saved = state_dict["state"]
        inner_state = {}
        for k, s in enumerate(self._slices):
            if s.param not in saved:
                continue
            p, entries = self._params[s.param], {}
            for key, value in saved[s.param].items():
                if key in _SCALAR_STATE or value is None:
                    entries[key] = value
                elif not isinstance(value, torch.Tensor) or value.numel() != p.numel():
                    raise _C.InputError(f"hetseq.ShardedOptimizer.load_state_dict: state '{key}' of parameter "
                                        f"{s.param} has {getattr(value, 'numel', lambda: 'no')()} elements, the "
                                        f"parameter {p.numel()}; was it saved from another model?")
                else:
                    entries[key] = value.reshape(-1).narrow(0, s.offset, s.numel).clone()
            inner_state[k] = entries
        inner_groups, start = [None] * len(self._inner_group), 0
        for g, j in self._inner_group.items():
            count = len(self.optimizer.param_groups[j]["params"])
            inner_groups[j] = {**_options(self.param_groups[g]), "params": list(range(start, start + count))}
            start += count
        self.optimizer.load_state_dict({"state": inner_state, "param_groups": inner_groups})

    def _drop_group(self):
        # The C++ object is deleted with the GIL released; the group goes too, so that one the script destroyed
        # is joined now (Note [Process groups at exit]).
        self._gather = None
        self.process_group = None

    def __repr__(self):
        return (f"hetseq.ShardedOptimizer({self.optimizer_class.__name__}, rank {self.rank}: elements "
                f"[{self.shard.first}, {self.shard.first + self.shard.numel}) of "
                f"{sum(p.numel() for p in self._params)}, budget {self.budget_bytes} bytes)")


def class_path(cls):
    """`torch.optim.Adam`, `torch.optim.lr_scheduler.StepLR` (torch's public modules, not the files that define
    them); `module.Class` for others."""
    module = cls.__module__
    for public in ("torch.optim.lr_scheduler", "torch.optim"):
        if module.startswith(public):
            module = public
            break
    return f"{module}.{cls.__qualname__}"


def _options(group):
    """A param group's options: all but its parameters (and their names, which the shard's views do not have)."""
    return {k: v for k, v in group.items() if k not in ("params", "param_names")}
