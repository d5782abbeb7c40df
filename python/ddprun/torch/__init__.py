"""The c10d backend ``"ddp"``: ``dist.init_process_group("ddp")``.

Importing this module registers the backend (torch also loads it through
the ``torch.distributed.backends`` entry point, so the import is optional).
The backend bootstraps through whatever store torch hands it (env://,
tcp://, file://, a subgroup's prefixed store), so it runs under ddprun and
under torchrun alike.
"""

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


def _create(options, backend_options=None):
    """torch's creator for the backend (extended API): one libddp group per process group."""
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
