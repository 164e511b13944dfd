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
    # PYTHONFAULTHANDLER: a rank that dies of a signal (an abort in C++) prints every thread's Python stack.
    p = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", **(env or {})),
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        raise AssertionError(f"torchrun ran past {timeout} s\nstdout:\n{stdout}\nstderr:\n{stderr[-12000:]}")
    assert p.returncode == 0, f"torchrun exited {p.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr[-12000:]}"
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


def train_plan(ddp, optimizer, scheduler, plan, rank, last_epoch, loss_of, stop_after=None, on_stop=None,
               stop_at_top=False):
    """This rank's updates of `plan` from its position to the end of epoch `last_epoch`, each a backward_update,
    then the optimizer's and the scheduler's step; with `stop_after`, once that many updates are done, calls
    `on_stop()` (a checkpoint) and returns True: at the bottom of the loop's body, or with `stop_at_top` at the
    top of the next one (the plan has handed out the next update, which is not trained). Returns False at the
    end of the epochs."""
    for epoch in range(plan.epoch, last_epoch + 1):
        for update in plan.updates(rank, epoch):
            if stop_at_top and stop_after is not None and ddp.num_updates == stop_after:
                on_stop()
                return True
            optimizer.zero_grad()
            backward_update(ddp, plan.micro_batches, update, loss_of, samples=sum(map(len, update)))
            optimizer.step()
            scheduler.step()
            if not stop_at_top and stop_after is not None and ddp.num_updates == stop_after:
                on_stop()
                return True
    return False
