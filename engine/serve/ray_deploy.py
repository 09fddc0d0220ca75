"""`serve --address HOST:PORT`: the same speech app as a Ray Serve deployment.

Each replica is one `SpeechReplica`: its own `Pool` of warm workers (continuous
batching across the requests Ray Serve routes to it) behind the same Starlette
app as the single-machine server, so every route, limit and error shape is
the same. Ray Serve's HTTP proxy is in front.

Decisions, and why:
- Replicas: one per GPU of the cluster (each asks for one GPU), or
  `--replicas N` (each asks for `--replica-cpus` CPUs, default 1, so N
  replicas on nodes of one CPU land on N nodes). `--min-replicas` /
  `--max-replicas` hand the count to Ray Serve's autoscaler, which aims at
  `--rows` requests in progress per replica (one batch of rows).
- One proxy, on the head node (`HeadOnly`): the URL this prints is then the
  only one, and nodes of one machine (or a test's) do not fight over the port.
  It spreads requests over the replicas by load, not by node (`SPREAD_ENV`).
- Voices are found on the driver, by the same stable names; a replica only
  ever loads a folder the driver found, never a client's path. The folders
  must be visible at the same path on every node (a shared folder, as a
  training run's `--storage`); a replica that cannot see one fails to start
  and says so. The workspace is the registry the replicas share: a voice
  registered (`POST /v1/audio/voices`) or removed through one replica is on disk,
  and every replica reads the workspace again when its folder changes or a request
  names a voice it does not know (`SpeechApp`'s rescan), so all serve it or none.
- Ray Serve's own bound on requests per replica is set to the app's queue
  (`--queue`), so the app answers 429 with Retry-After itself; requests past
  every replica's bound wait in the proxy up to `--queue` more, then 503.
- Replica health is checked every 2 s (Ray Serve's default is 10 s), so a
  replica lost with its node is replaced soon after Ray notices the node is
  gone.
- Ending (Ctrl-C/SIGTERM): the application is deleted; Ray Serve itself is shut
  down only if this command started it (the cluster may serve other apps).

Imports ray lazily (the module is only imported for `--address`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import ray
from ray import serve
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
from ray.serve.api import RunTarget
from ray.serve.exceptions import RayServeException

from engine.cluster import connect
from engine.config.serve import ClusterServeSettings, ServeSettings
from engine.core.errors import ClusterError, InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.serve.app import create_app
from engine.serve.server import (
    check_settings,
    make_config,
    make_pool,
    preload,
    request_line,
    served_voices,
    url_of,
)

#: the application's name in Ray Serve (`serve status`, `serve.delete`)
APP_NAME = "voxshard"
#: Ray Serve's proxy sends every request to a replica on its own node until that replica
#: is full (`max_ongoing_requests`, our whole --queue), so a second GPU would stay idle
#: while the head's replica batches 32 requests. Off: requests go to the less busy of two
#: replicas, wherever they are. (The proxy inherits the controller's environment.)
SPREAD_ENV = {"RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
              "RAY_SERVE_PROXY_PREFER_LOCAL_AZ_ROUTING": "0"}
#: how long the deployment may take to reach RUNNING (replicas load their voice)
DEPLOY_TIMEOUT_S = 600.0

log = logging.getLogger("ray.serve")


def _replica_log(record: dict[str, Any]) -> None:
    # a replica's request log goes to its Ray Serve log file on its node (an instruction the
    # voice was not trained for as a warning, as `serve` logs it)
    line, level = request_line(record)
    log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", line)


class _Replica:
    """One replica: a pool of warm workers for the driver's voices, and the app."""

    def __init__(self, settings: ServeSettings, voices: dict[str, Any],
                 key: str | None) -> None:
        missing = [v.name for v in voices.values() if not v.target.exists()]
        if missing:
            raise InputError(f"This node ({socket.gethostname()}) cannot see the folder of "
                             f"{', '.join(missing)}.", "Put the voices in a folder every node "
                             "mounts at the same path.")
        ctx = ray.get_runtime_context()
        self.pool = make_pool(settings, voices)
        self.settings = settings
        if settings.preload and voices:
            preload(self.pool, next(iter(voices)))
        self.config = make_config(settings, key, node_id=ctx.get_node_id(),
                                  replica=ctx.get_actor_name() or ctx.get_actor_id(),
                                  pid=os.getpid())

    def __serve_build_asgi_app__(self) -> Any:
        # every replica reads the shared workspace again when it changes, so a voice
        # registered or removed through one replica is served or refused by all
        return create_app(self.pool, self.config, _replica_log,
                          lambda: served_voices(self.settings))


def _deployment() -> Any:
    return serve.deployment(serve.ingress()(_Replica))


def plan_replicas(cluster: ClusterServeSettings, gpus: float,
                  device: str | None) -> dict[str, Any]:
    """Ray Serve's options: how many replicas and what each asks for."""
    on_gpu = gpus >= 1 and device != "cpu" and cluster.replicas is None
    actor: dict[str, Any] = {"num_cpus": cluster.replica_cpus}
    if on_gpu:
        actor["num_gpus"] = 1
    count = cluster.replicas or (int(gpus) if on_gpu else 1)
    if count < 1:
        raise InputError("{cluster_serve.replicas} must be at least 1.")
    options: dict[str, Any] = {"ray_actor_options": actor}
    if cluster.min_replicas is not None or cluster.max_replicas is not None:
        low = cluster.min_replicas if cluster.min_replicas is not None else 1
        high = cluster.max_replicas if cluster.max_replicas is not None else max(low, count)
        if not 0 <= low <= high or high < 1:
            raise InputError("Need 0 <= {cluster_serve.min_replicas} <= "
                             "{cluster_serve.max_replicas}, and at least 1 at most.")
        options["autoscaling_config"] = {
            "min_replicas": low, "max_replicas": high,
            "initial_replicas": min(max(count, low), high)}
    else:
        options["num_replicas"] = count
    return options


def serve_on_ray(settings: ServeSettings, cluster: ClusterServeSettings,
                 on_event: EventCallback | Emitter | None = None,
                 stop: threading.Event | None = None) -> dict[str, Any]:
    """Deploy on the cluster at `cluster.address`; serve until SIGINT/SIGTERM (or `stop`)."""

    emitter = as_emitter(on_event)
    key = check_settings(settings)
    voices = served_voices(settings)
    try:
        from ray import serve  # noqa: PLC0415
    except ImportError:
        raise InputError("Serving on a Ray cluster needs Ray Serve, which is not installed.",
                         "pip install 'voxshard[ray-serve]' (ray[serve] of the same "
                         "version as ray).") from None
    handle = connect(cluster.address, on_event=emitter)
    stop = stop or threading.Event()
    previous = _stop_on_signals(stop)
    started_serve = False
    try:
        options = plan_replicas(cluster, handle.num_gpus, settings.device)
        options.update(
            name="speech",
            max_ongoing_requests=settings.queue,
            max_queued_requests=settings.queue,
            health_check_period_s=2.0,
            health_check_timeout_s=10.0,
            graceful_shutdown_timeout_s=5.0)
        if "autoscaling_config" in options:
            options["autoscaling_config"]["target_ongoing_requests"] = settings.rows
        started_serve = not _serve_running()
        serve.start(proxy_location="HeadOnly",
                    http_options={"host": settings.host, "port": settings.port},
                    controller_options={"runtime_env": {"env_vars": SPREAD_ENV}})
        if not started_serve:
            emitter.log("Ray Serve was already running on this cluster: its HTTP proxy "
                        "settings stand.", level="warning")
        app = _deployment().options(**options).bind(settings, voices, key)
        emitter.state("deploying", detail=f"{APP_NAME} on {handle.address}",
                      replicas=options.get("num_replicas") or options["autoscaling_config"])
        t0 = time.monotonic()
        _run(serve, app, stop)
        url = url_of(settings.host, settings.port)
        nodes = len([n for n in ray.nodes() if n["Alive"]])
        emitter.state("serving", detail=url, url=url, port=settings.port,
                      voices=sorted(voices), auth=key is not None, address=handle.address,
                      app=APP_NAME, nodes=nodes, deploy_s=round(time.monotonic() - t0, 1),
                      replicas=replica_states())
        while not stop.wait(1.0):
            pass
    finally:
        _restore_signals(previous)
        try:
            serve.delete(APP_NAME)
            if started_serve:
                serve.shutdown()
        except Exception as exc:  # the cluster went away under us: nothing left to delete
            emitter.log(f"Could not remove the application from Ray Serve: {exc}",
                        level="warning")
        handle.close()
    return {"url": url_of(settings.host, settings.port), "app": APP_NAME,
            "summary": f"Stopped serving {APP_NAME} on the Ray cluster."}


def _run(serve: Any, app: Any, stop: threading.Event) -> None:
    """Deploy and wait for RUNNING (or `stop`); a failed deployment says why."""
    # not `serve.run`: it would wait for RUNNING without end when a replica cannot be
    # placed, deaf to Ctrl-C (our handler only sets `stop`)
    serve.run_many([RunTarget(app, name=APP_NAME, route_prefix="/")],
                   wait_for_applications_running=False)
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while time.monotonic() < deadline:
        if stop.is_set():
            return
        try:
            status = serve.status().applications.get(APP_NAME)
        except RayServeException:
            status = None
        state = str(getattr(status, "status", "")) if status else ""
        if state.endswith("RUNNING"):
            return
        if status is not None and state.endswith("DEPLOY_FAILED"):
            raise ClusterError(f"The speech deployment failed: {status.message[-600:]}",
                               "Check that every node sees the voice folders and has the "
                               "memory for a replica.")
        time.sleep(0.5)
    raise ClusterError("The speech deployment did not start in time.",
                       "Check `serve status` on the cluster.")


def _serve_running() -> bool:
    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def replica_states() -> dict[str, int]:
    """Replica count by state (RUNNING, STARTING, ...) of the speech deployment."""
    app = serve.status().applications.get(APP_NAME)
    if app is None:
        return {}
    dep = app.deployments.get("speech")
    return {str(k).rsplit(".", 1)[-1]: v for k, v in (dep.replica_states if dep else {}).items()}


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
