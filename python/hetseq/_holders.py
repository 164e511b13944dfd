"""hetseq's objects that hold a process group (a Reducer, a ShardGather): at exit each drops it, before the
interpreter's finalization, so that a group that the script destroyed joins its Gloo threads while they can still
take the GIL: Note [Process groups at exit] (python/src/bindings.h)."""
import atexit
import weakref

holding = weakref.WeakSet()  # objects with a _drop_group() method


@atexit.register
def _drop_groups():
    for holder in list(holding):
        holder._drop_group()
