"""The Ray cluster a training run uses: a private local one, or an existing one.

Decisions, and why:
- A local cluster binds to 127.0.0.1 and starts without the dashboard: a
  voice-cloning app has no business opening ports on the network, and the
  dashboard costs memory and start-up time. `dashboard=True` turns it on.
  Passing `_node_ip_address="127.0.0.1"` is not enough: Ray on Linux swaps a
  loopback address for a "remotely reachable" one and its gRPC servers listen
  on every interface. Its macOS/Windows single-machine mode
  (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) keeps the node address on loopback,
  and then GCS, raylet and workers listen on 127.0.0.1 only (checked with
  `ss -ltn`). gloo's rendezvous follows the node address, so it stays local too.
- Token authentication (`RAY_AUTH_MODE`): a loopback-only cluster is reachable
  only from this machine, and token mode would write a secret under
  `~/.ray/`. So for a local cluster we set `disabled` unless the user chose a
  mode himself (an explicit mode also silences Ray's warning about it). For an
  existing cluster we touch nothing: its owner decided.
- Logs: worker and actor output is *not* forwarded to the driver by default
  (`log_to_driver=False`). Our own workers report through the metrics queue,
  failures come back as exceptions from `fit()`, and what Ray's internals
  print (placement-group cleaner warnings about the State API once a second
  when there is no dashboard, controller chatter) is noise to a person
  cloning a voice. Everything is still in the session's log folder, whose
  path `ClusterHandle.log_dir` gives. `verbose=True` forwards it all.
- `RAY_TRAIN_ENABLE_PRINT_PATCH=0`: otherwise every worker print appears twice.
- Code: the `engine` package travels with the job (`code_runtime_env`: Ray's
  `py_modules`), so workers on any node run the driver's engine code without
  it being installed there or on the driver's PYTHONPATH.
- A local cluster's single-machine settings are undone before joining an
  existing cluster, so an earlier local run in the same process does not stop
  a later one from joining a multi-node cluster.

This module imports ray lazily so the light parts of the engine stay light.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray
from ray._private import ray_constants

from engine.core.errors import ClusterError
from engine.core.events import Emitter, EventCallback, as_emitter

LOOPBACK = "127.0.0.1"

#: environment every Ray process of ours inherits; set before ray starts
_QUIET_ENV = {
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # usage stats would try to reach the network at shutdown
    "RAY_USAGE_STATS_ENABLED": "0",
    # one thread per worker process unless the caller chose otherwise: the
    # cores are shared by several workers and each would start one per core
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
}


@dataclass
class ClusterHandle:
    """A connected cluster. `close()` ends it if we started it."""

    address: str
    started_here: bool
    num_cpus: float
    num_gpus: float
    log_dir: str | None
    #: Ray was already connected in this process (by a test, a notebook): `close()` leaves
    #: that connection, and a cluster it started, to its owner
    borrowed: bool = False
    #: pids of the Ray processes this driver started (local cluster only)
    _child_pids: set[int] = field(default_factory=set)
    _closed: bool = False

    def close(self, force: bool = False) -> None:
        """Disconnect; for a local cluster, also stop every Ray process it started.

        force: kill the local cluster's processes first. For a second Ctrl-C while
        a run is still going: `ray.shutdown()` under a live `fit()` can crash this
        process, and whatever it had not stopped yet would be left running.
        """
        if self._closed:
            return
        self._closed = True
        if self.borrowed:
            # ray.shutdown() would end a local cluster its owner started in this process
            return
        if self.started_here:
            # Ray's own children (gcs, raylet, workers) plus anything they spawned:
            # collected before shutdown, because after it the tree is gone.
            self._child_pids |= _descendants(os.getpid())
            if force:
                _reap(self._child_pids, timeout=0.0)
        ray.shutdown()
        if self.started_here:
            _reap(self._child_pids, timeout=10.0)
            # the process (and what it starts later, e.g. `ray start`) is as before
            _undo_loopback_only()

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _reap(pids: set[int], timeout: float) -> None:
    """Wait for `pids` to exit after ray.shutdown(); SIGKILL what lingers."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        # ray.shutdown() asks politely; a raylet worker stuck in a collective
        # (gloo waits for a peer that died) never answers, and must not outlive us
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5.0)


def ray_processes_of(pids: set[int]) -> list[int]:
    """The ones of `pids` still running (for tests and the cancel check)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    dashboard: bool = False,
    verbose: bool = False,
    temp_dir: str | None = None,
    on_event: EventCallback | Emitter | None = None,
) -> ClusterHandle:
    """Start a private local cluster (address None) or join an existing one.

    `address` is what `ray start --head` printed (``host:port``) or ``auto``.
    """
    emitter = as_emitter(on_event)
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)

    if ray.is_initialized():
        # e.g. a test or a notebook that already connected: use it as is, and
        # do not shut it down behind the caller's back
        res = ray.cluster_resources()
        return ClusterHandle(address=_gcs_address(), started_here=False,
                             num_cpus=res.get("CPU", 0.0), num_gpus=res.get("GPU", 0.0),
                             log_dir=None, borrowed=True)

    kwargs: dict[str, Any] = {
        "log_to_driver": verbose,
        "configure_logging": True,
        "logging_level": logging.INFO if verbose else logging.WARNING,
    }
    env_vars = {k: os.environ[k] for k in _QUIET_ENV}
    runtime_env = {"env_vars": env_vars, **code_runtime_env()}
    t0 = time.monotonic()
    if address is None:
        _loopback_only()
        if "RAY_AUTH_MODE" not in os.environ:
            os.environ["RAY_AUTH_MODE"] = "disabled"
            _LOCAL_ONLY_SET.add("RAY_AUTH_MODE")
        emitter.state("starting_cluster", detail="local Ray cluster on 127.0.0.1")
        kwargs.update(
            # "local" forces a new cluster even when RAY_ADDRESS is set
            address="local",
            _node_ip_address=LOOPBACK,
            include_dashboard=dashboard,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            runtime_env=runtime_env,
        )
        if dashboard:
            kwargs["dashboard_host"] = LOOPBACK
        if temp_dir:
            kwargs["_temp_dir"] = temp_dir
    else:
        # a local cluster started earlier in this process must not leave its
        # single-machine mode behind: joining a real cluster needs the default
        _undo_loopback_only()
        emitter.state("connecting_cluster", detail=address)
        kwargs.update(address=address, runtime_env=runtime_env)
    # Ray's core worker installs a C++ handler for SIGTERM that logs and aborts
    # the process (exit -6), which would skip our cooperative stop and leave
    # the cluster behind; put back the Python handler that was there before
    main_thread = threading.current_thread() is threading.main_thread()
    prev_term = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        ctx = ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if address is None:
            raise ClusterError(f"Could not start a local Ray cluster: {exc}",
                               "Check free memory and /tmp space, then try again.") from exc
        raise ClusterError(f"Could not reach the Ray cluster at {address}.",
                           "Check the address printed by `ray start --head` and that "
                           "this machine can reach it.") from exc
    finally:
        if main_thread and callable(prev_term):
            signal.signal(signal.SIGTERM, prev_term)
    res = ray.cluster_resources()
    handle = ClusterHandle(
        address=getattr(ctx, "address_info", {}).get("gcs_address") or _gcs_address(),
        started_here=address is None,
        num_cpus=res.get("CPU", 0.0),
        num_gpus=res.get("GPU", 0.0),
        log_dir=_log_dir(),
    )
    if handle.started_here:
        handle._child_pids = _descendants(os.getpid())
    emitter.log(f"Ray cluster ready in {time.monotonic() - t0:.1f} s "
                f"({handle.num_cpus:g} CPUs, {handle.num_gpus:g} GPUs)", level="debug")
    return handle


#: environment variables a local cluster set in this process (undone before joining another)
_LOCAL_ONLY_SET: set[str] = set()
_SAVED_CLUSTER_FLAG: list[bool] = []


def code_runtime_env() -> dict[str, Any]:
    """Voxshard's own code for every Ray worker, on every node.

    Ray zips the `engine` package of this process and hands it to each
    worker (cached by content hash on each node), so a node that has only
    the installed dependencies runs exactly the driver's engine code, and no
    worker depends on the driver's PYTHONPATH or current folder.
    """
    package = Path(__file__).resolve().parent
    return {"py_modules": [str(package)], "excludes": ["__pycache__/", "*.pyc"]}


def _loopback_only() -> None:
    """Put Ray in its single-machine mode (see the module docstring)."""
    # child processes (raylet, workers) read the variable at their import of ray
    if "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ:
        _LOCAL_ONLY_SET.add("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # ray read the variable when it was imported; its constant is read at call time
    if not _SAVED_CLUSTER_FLAG:
        _SAVED_CLUSTER_FLAG.append(bool(ray_constants.ENABLE_RAY_CLUSTER))
    ray_constants.ENABLE_RAY_CLUSTER = False


def _undo_loopback_only() -> None:
    """Forget what `_loopback_only` and the local cluster's defaults set."""
    for key in sorted(_LOCAL_ONLY_SET):
        os.environ.pop(key, None)
    _LOCAL_ONLY_SET.clear()
    if _SAVED_CLUSTER_FLAG:
        ray_constants.ENABLE_RAY_CLUSTER = _SAVED_CLUSTER_FLAG.pop()


def _gcs_address() -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # older/newer runtime context without the attribute
        return ""


def _log_dir() -> str | None:
    try:
        import ray._private.worker as ray_worker  # noqa: PLC0415

        node = ray_worker.global_worker.node
        return str(node.get_logs_dir_path()) if node is not None else None
    except Exception:  # private API; the path is only a convenience
        return None
