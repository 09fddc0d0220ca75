"""How a run's workers find each other: no listening socket for a local run.

Ray Train's torch backend rendezvous through torch's TCPStore, whose server
(in the rank-0 worker) listens on every interface for the run's duration
(`ss -ltn` showed `*:<port>`; torch has no option to bind it elsewhere). On a
local cluster every worker is on this machine, so `local_torch_config()`
rendezvous through a `FileStore` in a fresh temporary file instead: nothing
listens for it at all. gloo's own sockets follow `GLOO_SOCKET_IFNAME=lo`
(set for local runs by the launcher), so they bind 127.0.0.1, and so do NCCL's
bootstrap and socket transport on a GPU run (`NCCL_SOCKET_IFNAME=lo`, likewise;
`process_env`).

An existing cluster (`--address`) keeps Ray's TCP rendezvous: its workers
are on other machines and must reach rank 0 over the network.

torch's FileStore removes its file only when every rank closes it cleanly;
workers that Ray stops or kills leave it behind (one per run and restart, in
the temporary folder), so the backend removes each group's file when Ray
shuts that group down.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import uuid
from typing import Any

import ray
from ray.train.torch import TorchConfig
from ray.train.torch.config import (
    _set_torch_distributed_env_vars,
    _setup_torch_process_group,
    _TorchBackend,
)


def store_prefix(run: str) -> str:
    """The path prefix of a run's rendezvous files (`run`: its folder or storage URI)."""
    tag = hashlib.sha1(run.encode("utf-8")).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"voxshard-pg-{tag}-")


def local_torch_config(backend: str, run: str) -> Any:
    """A TorchConfig whose process group is set up through a FileStore (one machine only);
    `run` names the files (`store_prefix`)."""
    class _FileStoreBackend(_TorchBackend):
        store: str | None = None

        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            # a new file for every worker-group start: a restarted group must not
            # meet the keys of the one it replaces
            self._remove_store()
            path = self.store = store_prefix(run) + uuid.uuid4().hex
            worker_group.execute(_set_torch_distributed_env_vars)
            futures = [worker_group.execute_single_async(
                i, _setup_torch_process_group, backend=backend_config.backend, world_rank=i,
                world_size=len(worker_group), init_method=f"file://{path}",
                timeout_s=backend_config.timeout_s) for i in range(len(worker_group))]
            ray.get(futures)

        def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
            try:
                super().on_shutdown(worker_group, backend_config)
            finally:
                self._remove_store()

        def _remove_store(self) -> None:
            if self.store is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.store)
                self.store = None

    class LocalTorchConfig(TorchConfig):
        @property
        def backend_cls(self) -> type:
            return _FileStoreBackend

    return LocalTorchConfig(backend=backend)
