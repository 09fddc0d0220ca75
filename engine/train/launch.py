"""Launch one training run on a connected Ray cluster with Ray Train's TorchTrainer.

- One worker per selected GPU (NCCL), or N CPU workers (gloo).
- `FailureConfig(max_failures)`: a worker that dies (kill -9, OOM) makes Ray
  start a new worker group, which resumes from the last reported checkpoint.
- `RunConfig(storage_path=<voice>/runs, name=<run>)`: Ray's run folder *is*
  our run folder, so checkpoints, Ray's own state and metrics.jsonl sit together.
  With `--storage` (`engine.core.storage`) Ray's run folder is the run's storage
  location (a shared folder or a URI, handed to Ray with its filesystem so no
  path is ever parsed as a URI); config.json and metrics.jsonl stay in the
  voice's runs/<run> (which, for a shared folder, is a symlink to it).
- Workers run `entry.node_train_loop`: on its node it finds the base model
  (`preflight.node_model_dir`) and unpacks the prepared codes and x-vector
  that travel through the object store (`preflight.pack_voice_data`), so
  no worker reads a driver-local path; the engine's code itself travels with
  the job (`engine.cluster.code_runtime_env`).
- `CheckpointConfig(num_to_keep=k)`: Ray deletes all but the newest k (k >= 2; an
  evaluation beside training measures a copy it holds, `layout.checkpoints.hold`).
- `fit()` blocks, so it runs in a thread; the caller's thread stays free to
  pump metrics and to react to cancel (a cooperative stop flag the workers
  poll every step; they then write a final checkpoint and return normally).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.config.change import as_changes
from engine.core.errors import Cancelled, TrainingError
from engine.core.events import Emitter
from engine.core.storage import ray_storage, rmtree
from engine.layout.checkpoints import latest_checkpoint, list_checkpoints
from engine.layout.manifest import prepared_folder
from engine.layout.run import Run
from engine.train.entry import node_train_loop
from engine.train.failures import (
    fatal_of,
    host_oom_words,
    host_out_of_memory,
    kernel_oom_kills,
    last_line,
)
from engine.train.metrics_pump import MetricsPump, make_queue
from engine.train.parallelize import process_group_backend
from engine.train.pgroup import local_torch_config
from engine.train.preflight import pack_voice_data
from engine.train.process_env import process_env
from engine.train.retry_policy import no_retry_policy_class

#: seconds the workers get to write their final checkpoint after a stop request
STOP_GRACE_S = 300.0


class _StopFlag:
    """A tiny actor the driver sets and every worker reads once per step."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@dataclass
class LaunchSpec:
    """Everything one `fit()` needs; built by api.train."""

    config: dict[str, Any]
    run_dir: Path
    total_steps: int
    workers: int
    use_gpu: bool
    cpus_per_worker: int = 1
    max_failures: int = 2
    resume: bool = False
    #: "module:function" returning TrainParts; None = the product builder
    builder: str | None = None
    #: extra keys for the worker (voice folder, base model path, ...)
    extra: dict[str, Any] = field(default_factory=dict)
    #: where the checkpoints go (a folder or a URI); None: run_dir itself
    storage: str | None = None
    #: what every worker runs (default: training, `entry.node_train_loop`); the reinforce
    #: stage gives its own loop and the same launcher
    loop: Any = None

    @property
    def location(self) -> str:
        return self.storage or str(self.run_dir)


@dataclass
class LaunchResult:
    stopped: bool
    records: list[dict[str, Any]]
    checkpoint: Path | None
    launch_to_first_metric_s: float | None
    #: wall-clock time (epoch seconds) the first metric reached the driver
    first_metric_time: float | None
    fit_s: float
    restarts: int


class Launch:
    """One run: `start()`, then `wait()`; `request_stop()` from any thread."""

    def __init__(self, spec: LaunchSpec, emitter: Emitter) -> None:
        self.spec = spec
        self.emitter = emitter
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._result: Any = None
        self._stop_requested = False
        # Waited on instead of Thread.join: on Python 3.11 a KeyboardInterrupt
        # (Ctrl-C, or SIGTERM via the CLI) landing inside join() marks a still
        # running thread as stopped (the bpo-45274 clean-up), and the caller
        # would shut Ray down under a run that is busy saving its checkpoint.
        self._done = threading.Event()
        self._t_start = 0.0
        self._worker_starts = 0
        self.worker_pids: dict[int, int] = {}

    def _on_state(self, state: str, values: dict[str, Any]) -> None:
        if state == "checkpoint" and values.get("detail"):
            # rank 0 completed one: recorded for good, so an evaluation can account for
            # every checkpoint written, including those pruning took before it saw them
            Run(self.spec.run_dir).record_written(str(values["detail"]))
        if state == "worker_started":
            self._worker_starts += 1
            rank = int(values["rank"])
            if rank in self.worker_pids and rank == 0:
                # a second start of a rank: Ray replaced the worker group after a failure
                n = self._worker_starts // max(1, self.spec.workers)
                self.emitter.state("recovering", detail=f"restart {n}: a worker was lost; "
                                   "resuming from the last checkpoint")
            self.worker_pids[rank] = int(values["pid"])

    def start(self) -> Launch:
        spec = self.spec
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        # the driver's helpers live on the driver's node: on a cluster, a node that
        # dies must not take the metrics queue or the stop flag with it
        here = {"scheduling_strategy": NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False)}
        self.queue = make_queue(**here)
        self.flag = ray.remote(num_cpus=0)(_StopFlag).options(**here).remote()
        self.pump = _StatePump(self.queue, self.emitter, Run(spec.run_dir).metrics_file,
                               on_state=self._on_state).start()
        loop_config = {
            "config": spec.config,
            "run_dir": spec.location,
            "total_steps": spec.total_steps,
            "queue": self.queue,
            "stop_flag": self.flag,
            "resume": spec.resume,
            "builder": spec.builder,
            **spec.extra,
        }
        voice_dir = spec.extra.get("voice_dir")
        if voice_dir and prepared_folder(voice_dir).codes_index.is_file():
            # the codes and the x-vector through the object store: one put, every node
            # reads it from there (held here until fit() returns)
            self._voice_data = ray.put(pack_voice_data(spec.extra["voice_dir"]))
            loop_config["voice_data"] = self._voice_data
        parent, _, name = spec.location.rstrip("/").rpartition("/")
        storage_path, storage_fs = ray_storage(parent)
        resources = {"CPU": spec.cpus_per_worker}
        if spec.use_gpu:
            resources["GPU"] = 1
        trainer = _trainer_class()(
            spec.loop or node_train_loop,
            train_loop_config=loop_config,
            # on GPU a gloo group beside NCCL: CPU tensors (offloaded gradients
            # in clipping, DCP's planning) need a CPU collective backend
            # a local run rendezvous through a file (no TCPStore listening on every
            # interface); an existing cluster through Ray's TCP store (pgroup.py)
            torch_config=(local_torch_config(process_group_backend(spec.use_gpu), spec.location)
                          if spec.config["parallel"].get("address") is None
                          else TorchConfig(backend=process_group_backend(spec.use_gpu))),
            scaling_config=ScalingConfig(num_workers=spec.workers, use_gpu=spec.use_gpu,
                                         resources_per_worker=resources),
            run_config=RunConfig(
                name=name,
                storage_path=storage_path,
                storage_filesystem=storage_fs,
                failure_config=FailureConfig(max_failures=spec.max_failures),
                checkpoint_config=CheckpointConfig(
                    num_to_keep=int(spec.config["run"]["keep_checkpoints"])),
                # Ray's console reporter repeats what our events already say
                worker_runtime_env={"env_vars": {
                    "OMP_NUM_THREADS": str(spec.cpus_per_worker),
                    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
                    **process_env(spec.config["parallel"].get("address") is None),
                }},
            ),
        )
        self._t_start = time.time()
        # the kernel's OOM kills so far: one more by the end, with a process of the run
        # gone, is how a kernel kill is told from another crash
        self._kernel_kills = kernel_oom_kills()

        def run() -> None:
            try:
                self._result = trainer.fit()
            except BaseException as exc:  # handed to wait()
                self._error = exc
            finally:
                self._done.set()

        self._thread = threading.Thread(target=run, name="voxshard-fit", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask every worker to checkpoint and return at the end of its current step."""
        if self._stop_requested:
            return
        self._stop_requested = True
        self.emitter.state("stopping", detail="saving a final checkpoint")
        try:
            self.flag.set.remote()
        except Exception:
            pass

    def running(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def wait(self, poll_s: float = 0.2) -> LaunchResult:
        """Block until fit() ends. Ctrl-C / SIGTERM (KeyboardInterrupt) request a stop."""
        assert self._thread is not None
        deadline: float | None = None
        while not self._done.is_set():
            try:
                self._done.wait(poll_s)
            except KeyboardInterrupt:
                if self._stop_requested:
                    # a second interrupt: the caller shuts the cluster down hard
                    raise
                self.request_stop()
            if self._stop_requested and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                raise TrainingError("The workers did not stop within "
                                    f"{STOP_GRACE_S:.0f} s of the cancel request.")
        fit_s = time.time() - self._t_start
        self.pump.stop()
        first = self.pump.first_metric_time
        # Ray deletes the old checkpoints it registered; one it never heard of
        # (saved just before a worker died) would otherwise stay forever
        keep = int(self.spec.config["run"]["keep_checkpoints"])
        for old in list_checkpoints(self.spec.location)[:-keep]:
            rmtree(old)
        result = LaunchResult(
            stopped=self._stop_requested,
            records=self.pump.records,
            checkpoint=latest_checkpoint(self.spec.location),
            launch_to_first_metric_s=(first - self._t_start) if first else None,
            first_metric_time=first,
            fit_s=fit_s,
            restarts=max(0, self._worker_starts // max(1, self.spec.workers) - 1),
        )
        if self._error is not None:
            raise (self._host_oom(self._error, result.checkpoint)
                   or _as_training_error(self._error)) from self._error
        return result

    def _host_oom(self, exc: BaseException, checkpoint: Path | None) -> TrainingError | None:
        """A run ended by this machine running out of memory, in the app's words: which
        process, what the plan expected, what to change, the checkpoint that is kept."""
        oom = host_out_of_memory(exc, getattr(self, "_kernel_kills", None))
        if oom is None:
            return None
        extra, name = self.spec.extra, checkpoint.name if checkpoint else None
        plan = {"per_worker": extra.get("plan_bytes"), "whole_run": extra.get("plan_host_bytes"),
                "gpu": self.spec.use_gpu}
        changes = as_changes(extra.get("oom_advice"))
        what = ("Apply a change below" if changes else "Lower Workers or the batch size, or "
                "choose \u201cLoRA adapters\u201d under What trains")
        return TrainingError(
            host_oom_words(oom, self.worker_pids, plan, name),
            "Continue with --resume." if name else None,
            window_hint=f"{what}, then press {'Resume' if name else 'Start training'}.",
            changes=changes)


class _StatePump(MetricsPump):
    """MetricsPump that also lets the launcher see worker pids and state changes."""

    def __init__(self, *args: Any, on_state: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_state = on_state

    def handle(self, rec: dict[str, Any]) -> None:
        if rec.get("kind") == "state":
            values = dict(rec.get("values", {}))
            if self._on_state is not None:
                self._on_state(str(values.get("state")), values)
            state = str(values.pop("state", ""))
            self.emitter.state(state, **values)
            return
        super().handle(rec)


def _trainer_class() -> type:
    """TorchTrainer whose failure policy raises a FatalTrainingError instead of retrying it.

    Ray 2.60 builds its failure policy inside `fit()` with no way to pass
    one; the controller is started by `_initialize_and_run_controller`, which
    takes the policy as a keyword, so that is where ours goes in (Ray is pinned).
    """
    class VoxshardTrainer(TorchTrainer):
        def _initialize_and_run_controller(self, **kwargs: Any) -> Any:
            if "failure_policy" in kwargs:
                kwargs["failure_policy"] = no_retry_policy_class()(
                    self.run_config.failure_config)
            return super()._initialize_and_run_controller(**kwargs)

    return VoxshardTrainer


def _as_training_error(exc: BaseException) -> BaseException:
    if isinstance(exc, Cancelled | TrainingError):
        return exc
    fatal = fatal_of(exc)
    if fatal is not None:  # out of memory, disk full: one sentence and what to do
        return TrainingError(fatal.message, fatal.hint, changes=fatal.changes)
    return TrainingError(f"Training failed: {last_line(exc)}",
                         "Run again with --debug for the full worker traceback.")
