"""Real ranks for the Python extension's tests: a script under torchrun on this machine, and the update that its
workers run."""
import os
import signal
import subprocess
import sys


def torchrun(nproc, *args, timeout=420, env=None):
    """Runs `args` (a script and its arguments) on `nproc` ranks with `torchrun --standalone`, with `env` added to
    the environment; fails the test with the output when it exits non-zero, else returns its stderr. torchrun and
    its ranks run in a session of their own, killed as a whole when `timeout` passes: a rank that outlived a
    killed torchrun would wait for its store forever."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *map(str, args)]
    p = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        raise AssertionError(f"torchrun ran past {timeout} s\nstdout:\n{stdout}\nstderr:\n{stderr[-4000:]}")
    assert p.returncode == 0, f"torchrun exited {p.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr[-4000:]}"
    return stderr


def backward_update(ddp, micro_batches, update, loss_of, samples=None):
    """One update of a plan's index lists on this rank: each micro-batch's summed loss (`loss_of(indices)`) goes
    backward with its sample count, and an empty micro-batch (a rank with fewer than the most) is skipped."""
    with ddp.update(micro_batches, samples=samples) as u:
        for idx in update:
            if idx:
                u.backward(loss_of(idx), len(idx))
            else:
                u.skip()
