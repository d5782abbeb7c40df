"""The c10d backend ``"ddp"``: ``dist.init_process_group("ddp")``.

Importing this module registers the backend (torch also loads it through
the ``torch.distributed.backends`` entry point, so the import is optional).
The backend bootstraps through whatever store torch hands it (env://,
tcp://, file://, a subgroup's prefixed store), so it runs under ddprun and
under torchrun alike.
"""

import os

import torch

_MINIMUM = (2, 0)


def _torch_version():
    parts = torch.__version__.split("+")[0].split(".")
    return tuple(int(p) for p in parts[:2] if p.isdigit())


if _torch_version() < _MINIMUM:
    raise ImportError(
        f"ddprun.torch needs torch 2.0 or newer; this interpreter has torch {torch.__version__}"
    )

import torch.distributed as dist  # noqa: E402

from ddprun import _C  # noqa: E402

BACKEND = "ddp"


def _check_against_launcher(options):
    """The default group's rank and size must be the ones the launcher started."""
    if dist.is_initialized():
        return  # a subgroup: its own numbering
    for name, given in (("WORLD_SIZE", options.group_size), ("RANK", options.group_rank)):
        started = os.environ.get(name)
        if started is not None and started.isdigit() and int(started) != given:
            what = "world_size" if name == "WORLD_SIZE" else "rank"
            raise ValueError(
                f"backend ddp: init_process_group was given {what}={given}, but the launcher "
                f"started this process with {name}={started}"
            )


_counting_steps = False


def _count_optimizer_steps():
    """A training step, for ddprun status: every optimizer.step() of this process."""
    global _counting_steps
    if not _counting_steps:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(
            lambda optimizer, args, kwargs: _C.step_finished())
        _counting_steps = True


def _create(options, backend_options=None):
    """torch's creator for the backend (extended API): one libddp group per process group."""
    _check_against_launcher(options)
    _count_optimizer_steps()
    return _C.DdpBackend(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        str(options.group_id),
        list(options.global_ranks_in_group),
    )


def register():
    """Registers ``"ddp"`` with torch.distributed (idempotent).

    The entry point torch calls for the name, and what importing this module does.
    """
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def transport(group=None):
    """How the ``"ddp"`` group carries CPU tensors: ``"shm"`` (shared memory
    within a node, Gloo across nodes), ``"gloo"`` or ``"local"`` (a group of one)."""
    backend = dist.distributed_c10d._get_default_group() if group is None else group
    return backend._get_backend(torch.device("cpu")).cpu_transport


register()
