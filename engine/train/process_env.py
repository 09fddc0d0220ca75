"""The environment every training process gets (Ray's workers, the GPU proof's).

Kept apart from the launcher, which loads Ray at import: the Ray-free GPU proof
(`bench/gpu_proof.py`) sets the same variables on a machine without Ray.
"""

from __future__ import annotations

import os

#: the socket interfaces of gloo and NCCL (bootstrap and socket transport)
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def process_env(local: bool) -> dict[str, str]:
    """Environment variables for every training process of a run.

    CUDA numbers GPUs fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`, while
    NVML, nvidia-smi and `engine.train.gpus` number them by PCI bus: with it, a
    GPU index means the same device everywhere. A run on this machine alone
    (`local`) keeps gloo's and NCCL's sockets on loopback (see pgroup.py), unless
    the user named an interface; a cluster's workers must reach each other, so
    there the interfaces are left to the libraries.
    """
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if local:
        env.update({name: os.environ.get(name, "lo") for name in SOCKET_VARS})
    return env
