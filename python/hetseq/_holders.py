"""hetseq's objects that hold a process group (a Reducer, a ShardGather): at exit each drops it, before the
interpreter's finalization, so that a group that the script destroyed joins its Gloo threads while they can still
take the GIL: Note [Process groups at exit] (python/src/bindings.h)."""
import atexit
import weakref

holding = weakref.WeakSet()  # objects with a _drop_group() method

# Updates that hetseq.DistributedDataParallel finished in this process, all wrappers together: a Plan compares it
# with its value when the Plan handed out its last update, to tell whether that update was trained (Plan.position).
finished_updates = 0


@atexit.register
def _drop_groups():
    for holder in list(holding):
        holder._drop_group()
