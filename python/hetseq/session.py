"""hetseq.train: a registered C++ task (MNIST, BERT, or one of a --user-dir library) trained in this process, as
hetseq-train trains it, from Python."""
from . import _C


def _text(value):
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    return str(value)


def train(options, task_flags=None):
    """Trains `options["task"]` with `options`, hetseq-train's general flags by long name without dashes
    ({"task": "mnist", "max-update": 10, "save-dir": path, "cpu": True}), and `task_flags`, the task's own
    ({"data": path, "hidden-units": 16}); each flag means, defaults to (the task's defaults included) and is
    checked as on hetseq-train's command line. A value True is a switch given, False one left out; a list is
    comma-separated. One rank per process: a distributed run calls it in every rank's process (with the
    distributed flags, e.g. "distributed-init-method": "env://" under torchrun).

    Returns {"last_epoch", "num_updates", "stopped", "train": {stat: value}, "valid": {stat: value}}: the last
    epoch's training statistics and the last validation's of the first valid subset (loss in bits, accuracy
    for MNIST). A hetseq.UsageError for a bad or unknown flag, hetseq.InputError for bad data or files,
    hetseq.PeerError for a lost rank. See Note [hetseq.train and Python's signals] for SIGINT during the run."""
    options, task_flags = dict(options), {k: _text(v) for k, v in (task_flags or {}).items()}
    if "task" not in options:
        raise _C.UsageError("hetseq.train: options has no 'task'; name a registered task, e.g. {'task': 'mnist'}")
    if "data" in options:  # the task's path, though hetseq-train lists it with the general flags
        task_flags.setdefault("data", _text(options.pop("data")))
    flags = ["--task", _text(options.pop("task"))]
    for name, value in list(options.items()) + list(task_flags.items()):
        if value is True:
            flags.append(f"--{name}")
        elif value is not False:
            flags += [f"--{name}", _text(value)]
    return _C.train(flags, task_flags)
