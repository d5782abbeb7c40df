"""ddprun's Python package.

``ddprun.torch`` registers the c10d backend ``"ddp"``, torch.distributed's
collectives over libddp (shared memory within a node, Gloo across nodes,
NCCL for CUDA tensors where libddp was built with it). torch also finds
it by its entry point, so ``dist.init_process_group("ddp")`` works without
an import once the package is installed.
"""

__version__ = "0.1.0"
