"""How a run's workers find each other: no listening socket for a local run.

Ray Train's torch backend rendezvous through torch's TCPStore, whose server
(in the rank-0 worker) listens on every interface for the run's duration
(`ss -ltn` showed `*:<port>`; torch has no option to bind it elsewhere). On a
local cluster every worker is on this machine, so `local_torch_config()`
rendezvous through a `FileStore` in a fresh temporary file instead: nothing
listens for it at all. gloo's own sockets follow `GLOO_SOCKET_IFNAME=lo`
(set for local runs by the launcher), so they bind 127.0.0.1, and so do NCCL's
bootstrap and socket transport on a GPU run (`NCCL_SOCKET_IFNAME=lo`, likewise;
`launch.process_env`).

An existing cluster (`--address`) keeps Ray's TCP rendezvous: its workers
are on other machines and must reach rank 0 over the network.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any


def local_torch_config(backend: str) -> Any:
    """A TorchConfig whose process group is set up through a FileStore (one machine only)."""
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import (
        _set_torch_distributed_env_vars,
        _setup_torch_process_group,
        _TorchBackend,
    )

    class _FileStoreBackend(_TorchBackend):
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            # a new file for every worker-group start: a restarted group must not
            # meet the keys of the one it replaces
            path = os.path.join(tempfile.gettempdir(), f"voxshard-pg-{uuid.uuid4().hex}")
            worker_group.execute(_set_torch_distributed_env_vars)
            futures = [worker_group.execute_single_async(
                i, _setup_torch_process_group, backend=backend_config.backend, world_rank=i,
                world_size=len(worker_group), init_method=f"file://{path}",
                timeout_s=backend_config.timeout_s) for i in range(len(worker_group))]
            import ray

            ray.get(futures)

    class LocalTorchConfig(TorchConfig):
        @property
        def backend_cls(self) -> type:
            return _FileStoreBackend

    return LocalTorchConfig(backend=backend)
