"""`train(voice, base, ...)`: the Python API behind `voxshard-engine train` and the GUI.

Order of work, so that a bad configuration fails in a second and not after
a minute of cluster start-up: resolve the voice and the base model, check
the data, resolve the config (presets by data volume, then the caller's
overrides), predict memory, and only then start Ray and the run.

Cancel is cooperative: setting `stop` (a `threading.Event`), Ctrl-C or
SIGTERM (which the CLI turns into KeyboardInterrupt) asks the workers to
finish their step, write a checkpoint and return; then the local cluster is
shut down and every process it started is reaped. A second interrupt stops
waiting and shuts everything down at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.cluster import connect
from engine.config.train import TrainConfig
from engine.core.errors import Cancelled, InputError, TrainingError, VoxshardError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.storage import (
    checkpoint_root,
    expand_arg,
    link_run,
    run_location,
    storage_arg,
    user_path,
)
from engine.data.codes import extract_codes, extract_codes_ray
from engine.data.dataset import VoiceData, split_ids
from engine.layout.checkpoints import REINFORCE_STAGE, checkpoint_stage
from engine.layout.manifest import prepared_folder, read_manifest
from engine.layout.run import Run, pick_run
from engine.layout.tiers import TIER_ADAPTER, record_instant_base, run_adapter_dir
from engine.layout.voice import open_voice
from engine.model.adapter import AdapterRequest, export_adapter
from engine.model.checkpoint_weights import checkpoint_tensors, trained_weights
from engine.model.export import export_custom_voice
from engine.model.loading import check_base_model, resolve_model
from engine.train.checkpoint import free_bytes
from engine.train.gpus import visible_gpus
from engine.train.launch import Launch, LaunchSpec
from engine.train.plan import local_cpus, make_plan, relief
from engine.train.precision import PrecisionError
from engine.train.preflight import run_preflight
from engine.train.presets import (
    ADVISED_MINUTES,
    LARGE_MINUTES,
    MIN_CLIPS,
    MIN_SECONDS,
    preset,
)
from engine.train.request import TrainRequest
from engine.train.rundata import (
    DATA_FILE,
    check_same_data,
    data_fingerprint,
    record_data,
    record_resume,
    resume_changes,
    run_x_vector,
)


@dataclass
class DataSummary:
    clips: int
    seconds: float
    ids: tuple[str, ...] = ()

    def train_clips(self, cfg: TrainConfig) -> int:
        """Clips left for training after the validation split (the dataset's own rule)."""
        train_ids, _ = split_ids(list(self.ids), cfg.data.val_fraction, cfg.data.val_min,
                                 cfg.data.seed)
        return len(train_ids)

    @property
    def minutes(self) -> float:
        return self.seconds / 60.0


def data_summary(voice_dir: Path) -> DataSummary:
    """Usable clips and their total duration, from the prepare manifest."""
    if not prepared_folder(voice_dir).manifest.exists():
        raise InputError(f"{voice_dir.name} has no prepared clips.",
                         f"Run `voxshard-engine prepare {voice_dir}` first.")
    clips = read_manifest(voice_dir)
    seconds = sum(float(c.get("duration_s", 0.0)) for c in clips)
    return DataSummary(len(clips), seconds, tuple(str(c.get("id")) for c in clips))


def resolve_config(voice_dir: Path, model_dir: Path, talker_hidden: int,
                   summary: DataSummary, overrides: dict[str, dict[str, Any]],
                   speaker: str) -> TrainConfig:
    """Preset, then overrides; batch size made legal for the worker count."""
    base = TrainConfig().to_dict()
    for layer in (preset(summary.minutes, talker_hidden), overrides):
        for section, values in layer.items():
            base[section].update({k: v for k, v in values.items() if v is not None})
    base["model"]["base"] = str(model_dir)
    base["model"]["speaker_name"] = speaker
    workers = int(base["parallel"]["workers"])
    try:
        cfg = TrainConfig.from_dict(base)
    except ValueError as exc:
        raise InputError(f"Bad training setting: {exc}.") from exc
    if "batch_size" not in overrides.get("data", {}):
        # every worker needs a clip per micro-step, and one optimizer step must
        # fit in the training clips
        fit = summary.train_clips(cfg) // cfg.data.grad_accum
        cfg = cfg.replace(data={"batch_size": max(workers, min(cfg.data.batch_size, fit))})
    return cfg


def _new_run_name() -> str:
    return datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")


@dataclass
class RunStorage:
    """Where a run's checkpoints go, and whether the cluster is checked first."""

    #: the run's storage location: a folder or a URI (== str(run_dir) by default)
    location: str
    #: the base model as the caller named it (a hub id lets each node find its own copy)
    model_spec: str
    #: run the per-node preflight before training (default: on an existing cluster)
    preflight: bool
    #: remember `setting` as the voice's storage once the run's storage exists
    remember: bool = False
    setting: str | None = None


def _storage_for(voice: Any, storage: str | os.PathLike[str] | None) -> str | None:
    """--storage as given, else the voice's setting; "default" means the voice's runs/."""
    if storage is None:
        return voice.storage
    if str(storage).strip().lower() in ("", "default", "local"):
        return None
    return storage_arg(storage)


def worker_threads(use_gpu: bool | None, cpu_offload: bool, workers: int,
                   cores: int) -> int | None:
    """Torch threads per worker (and Ray CPUs per worker); None keeps the config's default.

    CPU workers share this machine's cores: each gets its share (one per worker
    would leave cores idle). So do GPU workers under CPU offload, whose AdamW
    step runs on the host: on one thread it took 12.6 s for 1.6B parameters.
    """
    if use_gpu is False or (use_gpu and cpu_offload):
        return max(1, cores // max(1, workers))
    return None


def detect_gpus(address: str | None) -> int:
    """GPUs training could use (CUDA_VISIBLE_DEVICES honoured), without starting CUDA here."""
    if address is not None:
        return -1  # decided by the cluster's resources once connected

    return len(visible_gpus())


def train(voice: str | Path, base: str, *, on_event: EventCallback | Emitter | None = None,
          stop: threading.Event | None = None, **options: Any) -> dict[str, Any]:
    """Fine-tune `base` on a prepared voice; returns a summary dict (the CLI's result).

    `options` are the fields of `TrainRequest` (workers, steps, lr, ...).
    Paths may be relative, start with `~`, and hold spaces or any characters.
    """
    return TrainRun(TrainRequest.of(voice, base, **options), on_event, stop).start()


class TrainRun:
    """One start of training, in named stages: resolve, plan, launch, watch.

    resolve: the voice, the base model, the data, the devices and workers, the
    run folder and its config; plan: memory (refused here, before any cluster
    starts, when it will not fit), disk; launch: the run's storage, the
    cluster, the preflight, the codes, the Ray Train job; watch: until it ends
    (or `stop`), then the summary. A dry run stops after plan.
    """

    def __init__(self, request: TrainRequest, on_event: EventCallback | Emitter | None = None,
                 stop: threading.Event | None = None) -> None:
        self.request = request.validated()
        self.emitter = as_emitter(on_event)
        self.stop = stop
        self.cfg: TrainConfig | None = None
        self.plan_result: Any = None
        self.run_extra: dict[str, Any] = {}
        self.resumed_changes: list[dict[str, Any]] = []
        self.interrupted = False

    def start(self) -> dict[str, Any]:
        self.resolve()
        self.plan()
        if self.request.dry_run:
            assert self.cfg is not None
            return {"dry_run": True, "config": self.cfg.to_dict(),
                    "plan": self.plan_result.to_dict(), "summary": self.plan_result.table()}
        self._storage()
        with _sigterm_as_interrupt():
            assert self.cfg is not None
            self.t0 = time.time()
            cluster = connect(self.cfg.parallel.address,
                              num_cpus=(local_cpus(self.cfg) if self.cfg.parallel.address
                                        is None else None),
                              verbose=self.request.verbose, on_event=self.emitter)
            try:
                self.launch(cluster)
                return self.watch()
            finally:
                t_close = time.time()
                # after a second interrupt fit() may still be running: end its processes first
                cluster.close(force=self.interrupted)
                self.emitter.log(f"Ray shut down in {time.time() - t_close:.1f} s",
                                 level="debug")

    # -- resolve ------------------------------------------------------------------------------
    def resolve(self) -> TrainConfig:

        req, emitter = self.request, self.emitter
        v = self.voice = open_voice(req.voice)
        self.base = expand_arg(str(req.base))
        # absolute: workers (on other nodes, in other folders) get this path
        model_dir = self.model_dir = Path(os.path.abspath(resolve_model(self.base,
                                                                        on_event=emitter)))
        info = check_base_model(model_dir)
        summary = data_summary(v.path)
        if summary.clips < MIN_CLIPS or summary.seconds < MIN_SECONDS:
            raise InputError(f"{v.display_name} has {summary.clips} usable clip(s), "
                             f"{summary.seconds:.0f} s of audio; training needs at least "
                             f"{MIN_CLIPS} clips and {MIN_SECONDS:.0f} s.",
                             "Record or import more speech, then prepare again.")
        if summary.minutes < ADVISED_MINUTES:
            emitter.log(f"Only {summary.minutes:.1f} minutes of usable audio; "
                        f"{ADVISED_MINUTES:g}-{LARGE_MINUTES:g} minutes usually give a much "
                        "better voice.", level="warning")

        gpus = detect_gpus(req.address)
        self.workers_given = req.given("workers") is not None
        use_gpu = req.use_gpu
        if use_gpu is None and req.address is None:
            use_gpu = gpus > 0
        # an existing cluster (--address): GPUs or not is known once connected
        workers = req.given("workers") if self.workers_given else (
            gpus if use_gpu and gpus > 0 else 2)
        if use_gpu and gpus >= 0 and workers > gpus:
            raise InputError(f"You asked for {workers} worker{'s' if workers != 1 else ''} but "
                             f"this machine has {gpus} GPU{'s' if gpus != 1 else ''}.",
                             f"Set {{parallel.workers}} to {max(1, gpus)}, or train on the CPU "
                             "instead.")

        threads = worker_threads(use_gpu, bool(req.given("cpu_offload")), workers,
                                 os.cpu_count() or 1)
        overrides = req.overrides(workers, use_gpu, threads)
        if "predictor_frames" not in overrides["model"] and not req.resume:
            overrides["model"]["predictor_frames"] = v.predictor_frames  # voice.toml [train]
        if "lora_predictor" not in overrides["model"] and not req.resume \
                and req.given("trainable") == "lora":
            overrides["model"]["lora_predictor"] = v.lora_predictor  # voice.toml [train]
        runs_dir = v.runs_dir
        if req.resume:
            found = pick_run(v.path, req.run)
            if found is None:
                raise InputError(f"There is no run {req.run or ''} to resume in "
                                 f"{runs_dir}.".replace("run  to", "run to"),
                                 "Start a new run without --resume.")
            run_dir = found.path
            _refuse_reinforced(found)

            # the data position in a checkpoint indexes this run's clips: refuse other data
            check_same_data(run_dir, v.path, data_fingerprint(v.path))
            saved = found.read_config()
            was = bool((saved.get("model") or {}).get("lora_predictor"))
            if req.given("lora_predictor") is not None and req.given("lora_predictor") != was:
                # its checkpoints hold the adapters it was started with, no others
                raise InputError(f"The run {found.name} trains "
                                 f"{'its' if was else 'no'} adapters on the code predictor, "
                                 "and a resumed run keeps the adapters it has.",
                                 "Resume it without changing {model.lora_predictor}, or start "
                                 "a new run.")

            before = json.loads(json.dumps(saved))
            # the saved config wins except for what the caller changed now (e.g. more steps)
            for section, values in overrides.items():
                saved.setdefault(section, {}).update(
                    {k: val for k, val in values.items() if val is not None})
            cfg = TrainConfig.from_dict(saved)
            _refuse_finished(found, cfg.run.steps)
            self.resumed_changes = resume_changes(before, cfg.to_dict())
            for change in self.resumed_changes:
                emitter.log(change["message"], level="warning")
        else:
            run_dir = runs_dir / (req.run or _new_run_name())
            if run_dir.is_symlink() or (run_dir.exists() and any(run_dir.iterdir())):
                raise InputError(f"Run {run_dir.name} already exists.",
                                 "Pass --resume to continue it, or choose another --run name.")
            cfg = resolve_config(v.path, model_dir, info.talker_hidden, summary, overrides,
                                 v.speaker)
        self.run_dir = run_dir
        cfg = cfg.replace(run={"name": run_dir.name})
        n_train, per_step = summary.train_clips(cfg), cfg.data.batch_size * cfg.data.grad_accum
        if n_train < per_step:
            raise InputError(f"Only {n_train} training clips, fewer than one optimizer step "
                             f"needs ({per_step}).",
                             "Prepare more audio or lower {data.batch_size}.")

        self.use_gpu = use_gpu
        self.cfg = cfg
        return cfg

    # -- plan ---------------------------------------------------------------------------------
    def plan(self) -> Any:

        assert self.cfg is not None
        cfg, req = self.cfg, self.request
        device = "cuda" if self.use_gpu else "cpu"  # an unknown remote cluster: planned as CPU
        try:
            plan = make_plan(self.model_dir, cfg, device=device, voice_dir=self.voice.path,
                             free=None if req.address is None else [])
        except PrecisionError as exc:
            raise InputError(str(exc), "Set {parallel.precision} to fp16 (or fp32) on this "
                             "GPU.") from exc

        if req.address is None:
            # "auto" choices resolved by the plan (an existing cluster's GPUs resolve them
            # at launch, `cluster_gpu_plan`)
            cfg = self.cfg = resolved(cfg, plan)
        # dry runs show it as their result; real runs keep it for --json consumers
        self.emitter.log(plan.table(), level="debug")
        self.plan_result = plan
        if req.dry_run:
            return plan
        if not plan.fits:
            # on CPU the workers share the machine with the driver and Ray: the whole run
            need = (f"{plan.total / (1 << 30):.1f} GiB per GPU" if self.use_gpu else
                    f"{plan.host_total / (1 << 30):.1f} GiB for the whole run")
            raise InputError(f"Training will not fit: it needs about {need}. "
                             f"{plan.advice[0]}", " ".join(plan.advice[1:]) or None)
        _check_disk(self.run_dir, plan.checkpoint_bytes, cfg.run.keep_checkpoints,
                    self.emitter)
        # what a worker says when CUDA runs out of memory anyway, and the figure it is
        # measured against
        self.run_extra = {"oom_advice": relief(plan, self.model_dir, cfg, device),
                          "plan_bytes": plan.total, "plan_host_bytes": plan.host_total,
                          "model_spec": self.base}
        return plan

    # -- launch -------------------------------------------------------------------------------
    def _storage(self) -> None:
        """The run's folder and where its checkpoints go (a folder, a shared one, a URI)."""
        req, v, run_dir = self.request, self.voice, self.run_dir
        assert self.cfg is not None
        if self.resumed_changes:
            record_resume(run_dir, self.resumed_changes)
        given = req.storage is not None and str(req.storage).strip() != ""
        target = _storage_for(v, req.storage)
        if req.resume:
            location = str(checkpoint_root(run_dir))
        else:
            location = run_location(target, v.runs_dir, v.path.name, run_dir.name)
        self.where = RunStorage(location=location, model_spec=self.base,
                            preflight=(req.address is not None if req.preflight is None
                                       else bool(req.preflight)),
                            remember=given, setting=target)
        # the run's folder: a plain folder, a symlink to a shared folder, or a
        # folder with storage.json naming the URI its checkpoints go to
        try:
            link_run(run_dir, location)
        except Exception as exc:  # OSError, or a bucket's own (e.g. botocore: no credentials)
            why = getattr(exc, "strerror", None) or str(exc).strip().split("\n")[0] \
                or type(exc).__name__
            raise InputError(f"Cannot create the run's storage at {location}: {why}.",
                             "Check that the storage folder or bucket exists and is "
                             "writable.") from exc
        if self.where.remember:
            v.set_storage(self.where.setting)  # the voice's next runs go there too
        Run(run_dir).write_config(self.cfg.to_dict())
        # an instant voice prepared before any base was chosen speaks on this one from now
        record_instant_base(v.path, self.cfg.model.base)

    def launch(self, cluster: Any) -> Any:
        """Devices of an existing cluster, preflight, codes, then the Ray Train job."""

        assert self.cfg is not None
        cfg, req, emitter, v, run_dir = (self.cfg, self.request, self.emitter, self.voice,
                                         self.run_dir)
        if cfg.parallel.use_gpu is None:
            # an existing cluster: its GPUs decide, one worker per GPU by default
            gpus = int(cluster.num_gpus)
            workers = cfg.parallel.workers if self.workers_given or not gpus else gpus
            cfg = cfg.replace(parallel={"use_gpu": gpus > 0, "workers": workers},
                              data={"batch_size": max(cfg.data.batch_size, workers)})
            Run(run_dir).write_config(cfg.to_dict())
        if cfg.parallel.use_gpu and cluster.num_gpus < cfg.parallel.workers:
            raise InputError(f"You asked for {cfg.parallel.workers} workers but the cluster "
                             f"has {cluster.num_gpus:g} GPUs.",
                             f"Set {{parallel.workers}} to {int(cluster.num_gpus) or 1}.")

        same_model_path = True
        where = self.where
        if where.preflight:
            report = _preflight_or_fail(where, self.model_dir, emitter)
            same_model_path = all(n.model.endswith("(same path as the driver)")
                                  for n in report.nodes)
            if cfg.parallel.use_gpu:
                gpu_plan = cluster_gpu_plan(report, self.model_dir, cfg, v.path, emitter)
                if gpu_plan is not None:
                    cfg = resolved(cfg, gpu_plan)
                    self.run_extra["plan_bytes"] = gpu_plan.total
                    Run(run_dir).write_config(cfg.to_dict())
        # codes are cached by content hash: a re-run or a resume encodes nothing
        if same_model_path:
            index = extract_codes_ray(v.path, self.model_dir,
                                      reference_clip=cfg.data.reference_clip, on_event=emitter)
        else:
            # extraction tasks load the model from the driver's path, which some node
            # lacks (it has the model elsewhere): encode here instead, once (cached)
            emitter.log("Some nodes keep the base model elsewhere; encoding the clips on this "
                        "machine.", level="debug")
            index = extract_codes(v.path, self.model_dir,
                                  reference_clip=cfg.data.reference_clip, on_event=emitter)
        if not (run_dir / DATA_FILE).is_file():
            # tie the run to its data: the fingerprint, and the x-vector it trains with
            record_data(run_dir, v.path, x_vector=index.x_vector(),
                        reference_clip=index.reference_clip)
        per_epoch = steps_per_epoch(cfg, v.path, self.model_dir, emitter)
        self.total_steps = (int(cfg.run.steps) if cfg.run.steps is not None
                            else max(1, math.ceil(cfg.run.epochs * per_epoch)))
        self.cfg = cfg
        spec = LaunchSpec(config=cfg.to_dict(), run_dir=run_dir, total_steps=self.total_steps,
                          workers=cfg.parallel.workers, use_gpu=bool(cfg.parallel.use_gpu),
                          cpus_per_worker=cfg.parallel.cpu_threads_per_worker,
                          max_failures=req.max_failures, resume=req.resume,
                          builder=req.builder,
                          storage=(where.location if where.location != str(run_dir)
                                   else None),
                          extra={"voice_dir": str(v.path), "model_dir": str(self.model_dir),
                                 **self.run_extra})
        emitter.state("training", detail=f"{run_dir.name}: {self.total_steps} steps on "
                      f"{cfg.parallel.workers} worker(s)", run=str(run_dir),
                      total_steps=self.total_steps)
        self.job = Launch(spec, emitter).start()
        if self.stop is not None:
            threading.Thread(target=_watch_stop, args=(self.stop, self.job),
                             daemon=True).start()
        return self.job

    # -- watch --------------------------------------------------------------------------------
    def watch(self) -> dict[str, Any]:
        """Until the job ends; then the run's summary."""
        try:
            result = self.job.wait()
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        run_dir, total_steps = self.run_dir, self.total_steps
        losses = [r["values"] for r in result.records
                  if r["kind"] == "train" and "loss/train" in r["values"]]
        vals = [r["values"] for r in result.records if r["kind"] == "val"]
        if result.checkpoint is not None:
            self.emitter.artifact(str(result.checkpoint), "checkpoint")
        out: dict[str, Any] = {
            "run": str(run_dir),
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "steps": losses[-1]["step"] if losses else 0,
            "total_steps": total_steps,
            "stopped": result.stopped or self.interrupted,
            "first_loss": losses[0]["loss/train"] if losses else None,
            "final_loss": losses[-1]["loss/train"] if losses else None,
            "final_val_loss": vals[-1]["loss/val"] if vals else None,
            "restarts": result.restarts,
            "launch_to_first_metric_s": result.launch_to_first_metric_s,
            # including the cluster start and code extraction: what a user waits
            "start_to_first_metric_s": (result.first_metric_time - self.t0
                                        if result.first_metric_time else None),
            "wall_s": time.time() - self.t0,
        }
        verb = "Stopped" if out["stopped"] else "Finished"
        out["summary"] = (f"{verb} {run_dir.name} at step {out['steps']}/{total_steps}"
                          + (f", loss {out['final_loss']:.4f}"
                             if out["final_loss"] is not None else "")
                          + (f"; checkpoint {result.checkpoint.name}"
                             if result.checkpoint else ""))
        assert self.cfg is not None
        if self.cfg.model.trainable == "lora" and result.checkpoint is not None \
                and not out["stopped"]:
            adapter = out["adapter_voice"] = self._adapter_voice()
            if adapter is not None:
                out["summary"] += (f"; adapter voice {Path(adapter['out_dir']).name} ready "
                                   "to speak")
        return out

    def _adapter_voice(self) -> dict[str, Any] | None:
        return write_adapter_voice(self.voice.path, self.run_dir.name, self.emitter, "run")


def write_adapter_voice(voice: Path, run: str, emitter: Emitter, what: str
                        ) -> dict[str, Any] | None:
    """A finished LoRA run's (or its reinforce stage's: `what`) adapter voice, ready to
    speak: its checkpoint (the evaluation's best, else the last) written as `export
    --adapter` writes it into the voice's exports/ (replacing the run's own). The run
    itself stands when this fails: the warning says why, and `export --adapter` can try
    again."""
    out_dir = run_adapter_dir(voice, run)
    try:
        return export(voice, out_dir, run=run, adapter=True, on_event=emitter)
    except VoxshardError as exc:
        emitter.log(f"The {what} finished, but the run's adapter voice was not written: "
                    f"{exc.message} Write it with `voxshard-engine export {voice} {out_dir} "
                    f"--run {run} --adapter`.", level="warning")
        return None


def _refuse_finished(run: Run, steps: int | None) -> None:
    """A resume of a run already trained to its last step would start Ray to do nothing."""
    if steps is not None and run.finished(steps):
        raise InputError(f"The run {run.name} has already trained all its {steps} steps, so "
                         "there is nothing to resume.",
                         "Ask for more steps to continue it, or start a new run.")


def _refuse_reinforced(run: Run) -> None:
    """A run the reinforce stage went on from has one step numbering for both stages (the
    stage's checkpoints come after training's highest step), so training cannot go on in it:
    from its newest checkpoint it would take the stage's weights and AdamW state for its
    own, and from its newest training one its steps would land on the stage's numbers."""
    stage = [c for c in run.checkpoints() if checkpoint_stage(c) == REINFORCE_STAGE]
    if stage:
        raise InputError(f"The run {run.name} went on into the reinforce stage (up to "
                         f"{stage[-1].name}), so its training cannot be resumed.",
                         "Start a new run to train more, or continue the stage with "
                         "`voxshard-engine reinforce --resume`.",
                         window_hint="Start a new run to train more, or press Resume on "
                                     "the Reinforce tab.")


def _check_disk(run_dir: Path, checkpoint_bytes: int, keep: int, emitter: Emitter) -> None:
    """Say before starting when the disk cannot hold the checkpoints the run will keep."""
    gib = float(1 << 30)
    free = free_bytes(run_dir)
    # keep + 1: a new checkpoint is written before the oldest is deleted
    need = checkpoint_bytes * (keep + 1)
    if need > free:
        emitter.log(f"The disk holding {run_dir} has {free / gib:.1f} GiB free; keeping {keep} "
                    f"checkpoints of {checkpoint_bytes / gib:.1f} GiB needs about "
                    f"{need / gib:.1f} GiB. Each save checks the space first and the run "
                    "stops cleanly if it runs out.", level="warning")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C while a run is active (main thread only).

    The CLI already does this; a Python caller of `train()` gets the same
    clean stop (final checkpoint, cluster shut down) instead of dying with
    Ray processes left behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if not callable(prev):
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        if not callable(prev):
            signal.signal(signal.SIGTERM, prev)


def resolved(cfg: TrainConfig, plan: Any) -> TrainConfig:
    """`cfg` with the plan's choice for every "auto" that memory decides: gradient
    reduction with accumulation ("last" or "every") and whether parameters stay
    gathered between micro-steps ("on" or "off")."""
    if plan.accum_reduce not in ("last", "every"):
        return cfg  # no accumulation: neither applies
    parallel: dict[str, Any] = {"accum_reduce": plan.accum_reduce}
    if cfg.parallel.keep_gathered == "auto":
        parallel["keep_gathered"] = "on" if plan.keep_gathered else "off"
    return cfg.replace(parallel=parallel)


def cluster_gpu_plan(report: Any, model_dir: Path, cfg: TrainConfig, voice_dir: Path,
                     emitter: Emitter) -> Any:
    """The GPU plan against the cluster's own GPUs (--address; the preflight reads their
    free memory on each node): refuses a run that does not fit, like a local one."""
    free = report.gpu_free()
    if not free:
        return None
    plan = make_plan(model_dir, cfg, device="cuda", voice_dir=voice_dir, free=free,
                     capability=report.gpu_capability())
    emitter.log(plan.table(), level="debug")
    if not plan.fits:
        raise InputError(f"Training will not fit the cluster's GPUs: it needs about "
                         f"{plan.total / (1 << 30):.1f} GiB per GPU. {plan.advice[0]}",
                         " ".join(plan.advice[1:]) or None)
    return plan


def _preflight_or_fail(where: RunStorage, model_dir: Path, emitter: Emitter) -> Any:
    """Every node checked before anything starts; a bad node ends the start, named."""
    # the folder that holds the run (Ray's storage path): it exists before the run
    parent = where.location.rstrip("/").rpartition("/")[0]
    report = run_preflight(parent, str(model_dir), where.model_spec, on_event=emitter)
    if not report.ok:
        raise InputError(f"The cluster is not ready for this run: {report.problem_sentence()}.",
                         "Give every node the storage (--storage: a shared folder or an "
                         "s3:// URI) and the base model, with the same Python, torch and Ray "
                         "versions; `voxshard-engine preflight` shows each node.")
    return report


def _watch_stop(stop: threading.Event, launch: Any) -> None:
    while launch.running():
        if stop.wait(0.2):
            launch.request_stop()
            return


def steps_per_epoch(cfg: TrainConfig, voice_dir: Path, model_dir: Path,
                    emitter: Emitter) -> int:
    """Optimizer steps in one pass over the training clips (train-core's dataset decides)."""
    data = VoiceData.open(voice_dir, model_dir, cfg.data)
    try:
        data.check(cfg.parallel.workers)
    except TrainingError as exc:  # too little data for this batch/worker shape
        raise InputError(exc.message, exc.hint) from exc
    return int(data.steps_per_epoch())


def cancelled_error(result: dict[str, Any]) -> Cancelled:
    """What the CLI raises after a stopped run (exit code 130, not a failure)."""
    where = f" at step {result['steps']}" if result.get("steps") else ""
    ckpt = Path(result["checkpoint"]).name if result.get("checkpoint") else None
    return Cancelled(f"Training stopped{where}" + (f"; saved {ckpt}." if ckpt else "."),
                     "Continue later with --resume." if ckpt else None)


def export(voice: str | Path, out_dir: Path, *, run: str | None = None, step: int | None = None,
           name: str | None = None, adapter: bool = False, peft: bool = False,
           on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Write checkpoint `step` of a run as an official custom-voice folder; by default the
    checkpoint the run's evaluation judged best (`evaluate`), else the latest. With
    `adapter`, a LoRA run's adapters and speaker row alone (an adapter voice,
    `engine.model.adapter`), and with `peft` also in PEFT's folder format.

    Runs in this process, no Ray, no process group: DCP reads every shard and
    reassembles full tensors. Frozen weights come from the base model, the
    trained ones from the checkpoint (a LoRA run's adapters merged into their
    weights, `trained_weights`: the same tensors speaking from the run loads).
    """
    emitter = as_emitter(on_event)
    v = open_voice(voice)
    found = pick_run(v.path, run, with_checkpoint=True)
    if found is None:
        raise InputError(f"{v.display_name} has no training run"
                         + (f" {run}." if run else " with a checkpoint."),
                         "Train first with `voxshard-engine train`.",
                         window_hint="Press Start training first.")
    run_dir = found.path
    if step is None:
        ckpt = found.best()
        if ckpt is not None:
            emitter.log(f"Exporting {ckpt.name}, the best checkpoint of the evaluation "
                        "(give --step for another).")
        else:
            ckpt = found.latest()
    else:
        ckpt = found.checkpoint(step)
    if ckpt is None:
        steps = ", ".join(str(s) for s in found.steps())
        raise InputError(f"Run {run_dir.name} has no complete checkpoint"
                         + (f" at step {step}." if step is not None else "."),
                         f"Pick another --step ({steps}) or --run." if steps
                         else "Pick another --run.",
                         window_hint="Choose another run in the Run list above the charts, "
                                     "then press Export model again.")
    cfg = TrainConfig.from_dict(found.read_config())
    model_dir = resolve_model(cfg.model.base, on_event=emitter)
    emitter.state("exporting", detail=f"{run_dir.name}/{ckpt.name}")
    x_vector = run_x_vector(run_dir)
    if x_vector is None:  # a run from before the run kept its own copy
        x_vector = VoiceData.open(v.path, model_dir, cfg.data).x_vector
    speaker = (name or cfg.model.speaker_name or v.speaker).strip().lower()
    if adapter or peft:
        out = export_adapter(AdapterRequest(
            checkpoint_tensors(ckpt), model_dir, cfg.model.base, cfg.model.lora_rank,
            cfg.model.lora_alpha, speaker, x_vector,
            {"run": run_dir.name, "checkpoint": ckpt.name,
             "styles": found.trained_styles()}, peft=peft), user_path(out_dir),
            # the run's own adapter voice (written when it finished) is the run's to replace
            overwrite=user_path(out_dir) == user_path(run_adapter_dir(v.path, run_dir.name)))
        emitter.artifact(str(out), "adapter")
        return {"out_dir": str(out), "run": run_dir.name, "checkpoint": ckpt.name,
                "speaker": speaker, "tier": TIER_ADAPTER,
                "summary": f"Exported {run_dir.name}/{ckpt.name} as the adapter voice "
                           f"'{speaker}' on {cfg.model.base} to {out}."}
    # the rest of the tensors come from the base (export_custom_voice)
    trained = trained_weights(ckpt, model_dir, cfg.model.lora_scaling)
    out = export_custom_voice(model_dir, trained, speaker, x_vector, user_path(out_dir),
                              info={"run": run_dir.name, "checkpoint": ckpt.name,
                                    "styles": found.trained_styles()})
    emitter.artifact(str(out), "model")
    return {"out_dir": str(out), "run": run_dir.name, "checkpoint": ckpt.name,
            "speaker": speaker,
            "summary": f"Exported {run_dir.name}/{ckpt.name} as voice '{speaker}' to {out}."}
