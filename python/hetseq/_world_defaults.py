"""Imports torch.distributed.nn.functional while no default process group exists, if none does yet.

That module's functions take `group=group.WORLD` as a default argument, evaluated when it is first imported.
Imported after init_process_group (torch.optim's first optimizer imports it, through torch._dynamo), the
defaults hold the default group for good: dist.destroy_process_group() then leaves its Gloo worker threads
running into the interpreter's finalization, where one that releases a tensor Python has seen aborts the
process (Note [Process groups at exit], python/src/bindings.h). Imported first, the defaults are None, which
those functions read as the default group all the same."""
import torch.distributed as dist

if dist.is_available() and not dist.is_initialized():
    import torch.distributed.nn.functional  # noqa: F401
