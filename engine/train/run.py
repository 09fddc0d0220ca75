"""`TrainRun`: one start of training in named stages (resolve, plan, launch, watch).

Cancel is cooperative: setting `stop` (a `threading.Event`), Ctrl-C or
SIGTERM (which the CLI turns into KeyboardInterrupt) asks the workers to
finish their step, write a checkpoint and return; then the local cluster is
shut down and every process it started is reaped. A second interrupt stops
waiting and shuts everything down at once.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.cluster import connect
from engine.config.layers import PROVENANCE_KEY, Layer, flatten, provenance_lines, read_file
from engine.config.train import TrainConfig
from engine.core.errors import InputError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.storage import checkpoint_root, expand_arg, link_run, run_location
from engine.data.codes import extract_codes, extract_codes_ray
from engine.layout.run import DATA_FILE, Run, pick_run
from engine.layout.tiers import record_instant_base
from engine.layout.voice import Voice, open_voice
from engine.model.loading import check_base_model, resolve_model
from engine.train.export import write_adapter_voice
from engine.train.launch import Launch, LaunchSpec
from engine.train.plan import local_cpus, make_plan, refusal, relief
from engine.train.precision import PrecisionError
from engine.train.presets import (
    ADVISED_MINUTES,
    LARGE_MINUTES,
    MIN_CLIPS,
    MIN_SECONDS,
    preset_layers,
)
from engine.train.request import TrainRequest
from engine.train.resolve import (
    DataSummary,
    data_summary,
    detect_gpus,
    new_run_name,
    refuse_finished,
    refuse_reinforced,
    resolve_config,
    resume_base,
    steps_per_epoch,
    worker_threads,
)
from engine.train.run_storage import RunStorage, check_disk, preflight_or_fail, storage_for
from engine.train.rundata import (
    check_same_data,
    data_fingerprint,
    record_data,
    record_resume,
    resume_changes,
)

#: where a run ran, not how it trains: a config file's values of these are not taken
MACHINE_SETTINGS = ("parallel.use_gpu", "parallel.address", "parallel.cpu_threads_per_worker",
                    "run.name")


def voice_layer(v: Voice) -> Layer:
    """The voice's settings for its new runs: voice.toml [train] read as a partial tree of
    the training config ([train] predictor_frames, [train.optim] lr), and its speaker."""
    values = flatten(v.config.get("train", {}), TrainConfig, "voice.toml [train]",
                     skip=("storage",), error=WorkspaceError,
                     hint=f"Fix or remove that line of {v.voice_file}.")
    return Layer("voice.toml", {"model.speaker_name": v.speaker, **values}, chosen=True)


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
        # resolve's findings
        self.voice: Voice | None = None
        self.base = ""  # the base model as the caller named it (~ expanded)
        self.model_dir = Path()  # its folder, absolute
        self.workers_given = False
        self.use_gpu: bool | None = None  # None: an existing cluster's GPUs decide
        self.run_dir = Path()
        self.resumed_changes: list[dict[str, Any]] = []
        #: {"section.field": where its value came from} (`engine.config.layers`)
        self.provenance: dict[str, str] = {}
        # plan's
        self.plan_result: Any = None
        self.run_extra: dict[str, Any] = {}
        # launch's and watch's
        self.where: RunStorage | None = None
        self.t0 = 0.0
        self.total_steps = 0
        self.job: Launch | None = None
        self.interrupted = False

    def start(self) -> dict[str, Any]:
        self.resolve()
        self.plan()
        if self.request.dry_run:
            assert self.cfg is not None
            return {"dry_run": True, "config": self.cfg.to_dict(),
                    "provenance": self.provenance, "plan": self.plan_result.to_dict(),
                    "summary": "\n  ".join([
                        self.plan_result.table() + "\n\nSettings (and where they come from):",
                        *provenance_lines(self.cfg.to_dict(), self.provenance)])}
        self._storage()
        with sigterm_as_interrupt():
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
        req = self.request
        v = self.voice = open_voice(req.voice)
        given = (read_file(req.config, TrainConfig) if req.config is not None else {})
        # where a run ran is not how it trains: a file names its own machine's
        given = {k: val for k, val in given.items() if k not in MACHINE_SETTINGS}
        resumed = self._resumed_run(v) if req.resume else None
        info = self._base_model(resumed, req.base or given.get("model.base"))
        summary = self._usable_data(v)
        layers = self._asked_layers(given, new_run=resumed is None)
        saved: dict[str, Any] = {}
        if resumed is not None:
            run_dir, saved = resumed.path, self._resumable_config(v, resumed)
            # a saved config is whole: what an older run lacks, it trained by the default
            layers.append(Layer(f"the run {resumed.name} being resumed",
                                flatten(saved, TrainConfig,
                                        f"The run {resumed.name}'s config.json"),
                                chosen=True))
        else:
            run_dir = v.runs_dir / (req.run or new_run_name())
            if run_dir.is_symlink() or (run_dir.exists() and any(run_dir.iterdir())):
                raise InputError(f"Run {run_dir.name} already exists.",
                                 "Pass --resume to continue it, or choose another --run name.")
            layers += [voice_layer(v), *preset_layers(summary.minutes, info.talker_hidden,
                                                      req.preset)]
        cfg, merged = resolve_config(layers, summary, run_dir.name)
        self.provenance = merged.provenance
        if resumed is not None:
            self._resume_checks(resumed, saved, cfg)
        self.run_dir = run_dir
        n_train, per_step = summary.train_clips(cfg), cfg.data.batch_size * cfg.data.grad_accum
        if n_train < per_step:
            raise InputError(f"Only {n_train} training clips, fewer than one optimizer step "
                             f"needs ({per_step}).",
                             "Prepare more audio or lower {data.batch_size}.")
        self.cfg = cfg
        return cfg

    def _base_model(self, resumed: Run | None, named: str | None) -> Any:
        """The base model the run trains on (`named`, or a resumed run's own), its folder and
        what it is."""
        if resumed is None and not str(named or "").strip():
            raise InputError("No base model given.",
                             "Name one for {model.base}: Qwen/Qwen3-TTS-12Hz-0.6B-Base or a "
                             "model folder.")
        # a resumed run trains on its own base, whatever the caller's form shows now
        self.base = expand_arg(resume_base(resumed, named) if resumed is not None
                               else str(named))
        req, emitter = self.request, self.emitter
        if resumed is not None and req.base and expand_arg(str(req.base)) != self.base:
            emitter.log(f"A resumed run trains on its own base model: {self.base}.",
                        level="warning")
        # absolute: workers (on other nodes, in other folders) get this path
        self.model_dir = Path(os.path.abspath(resolve_model(self.base, on_event=emitter)))
        return check_base_model(self.model_dir)

    def _usable_data(self, v: Voice) -> DataSummary:
        """The voice's usable clips, refused when too few to train on."""
        summary = data_summary(v.path)
        if summary.clips < MIN_CLIPS or summary.seconds < MIN_SECONDS:
            raise InputError(f"{v.display_name} has {summary.clips} usable clip(s), "
                             f"{summary.seconds:.0f} s of audio; training needs at least "
                             f"{MIN_CLIPS} clips and {MIN_SECONDS:.0f} s.",
                             "Record or import more speech, then prepare again.")
        if summary.minutes < ADVISED_MINUTES:
            self.emitter.log(f"Only {summary.minutes:.1f} minutes of usable audio; "
                             f"{ADVISED_MINUTES:g}-{LARGE_MINUTES:g} minutes usually give a "
                             "much better voice.", level="warning")
        return summary

    def _asked_layers(self, given: dict[str, Any], new_run: bool) -> list[Layer]:
        """The layers over a resumed run's and the voice's: the request, its config file
        (`given`), and the devices found for what they ask."""
        req = self.request
        asked = {**given, **req.values()}
        use_gpu, workers = self._devices(asked.get("parallel.workers"))
        threads = worker_threads(use_gpu, bool(asked.get("parallel.cpu_offload")), workers,
                                 os.cpu_count() or 1)
        self.use_gpu = use_gpu
        request, config_file = dict(req.values()), dict(given)
        if new_run:  # a new run trains on the absolute folder of its base
            (request if req.base else config_file)["model.base"] = str(self.model_dir)
        return [Layer("the request", request, chosen=True),
                Layer(f"the config file {Path(req.config or '').name}", config_file,
                      chosen=True),
                Layer("the devices found", {"parallel.workers": workers,
                                            "parallel.use_gpu": use_gpu,
                                            "parallel.cpu_threads_per_worker": threads})]

    def _devices(self, given: int | None) -> tuple[bool | None, int]:
        """GPU or CPU (None: an existing cluster decides once connected), and the workers
        (`given`: asked for by the request or its config file)."""
        req = self.request
        gpus = detect_gpus(req.address)
        self.workers_given = given is not None
        use_gpu = req.use_gpu
        if use_gpu is None and req.address is None:
            use_gpu = gpus > 0
        # an existing cluster (--address): GPUs or not is known once connected
        workers = given if given is not None else (gpus if use_gpu and gpus > 0 else 2)
        if use_gpu and gpus >= 0 and workers > gpus:
            raise InputError(f"You asked for {workers} worker{'s' if workers != 1 else ''} but "
                             f"this machine has {gpus} GPU{'s' if gpus != 1 else ''}.",
                             f"Set {{parallel.workers}} to {max(1, gpus)}, or train on the CPU "
                             "instead.")
        return use_gpu, workers

    def _resumed_run(self, v: Voice) -> Run:
        """The run to resume (the one named, else the latest), or an InputError."""
        found = pick_run(v.path, self.request.run)
        if found is None:
            raise InputError(f"There is no run {self.request.run or ''} to resume in "
                             f"{v.runs_dir}.".replace("run  to", "run to"),
                             "Start a new run without --resume.")
        return found

    def _resumable_config(self, v: Voice, found: Run) -> dict[str, Any]:
        """The saved config of the run to resume; the runs that cannot go on refused."""
        req = self.request
        refuse_reinforced(found)
        # the data position in a checkpoint indexes this run's clips: refuse other data
        check_same_data(found.path, v.path, data_fingerprint(v.path))
        saved = found.read_config()
        was = bool((saved.get("model") or {}).get("lora_predictor"))
        if req.given("lora_predictor") is not None and req.given("lora_predictor") != was:
            # its checkpoints hold the adapters it was started with, no others
            raise InputError(f"The run {found.name} trains "
                             f"{'its' if was else 'no'} adapters on the code predictor, "
                             "and a resumed run keeps the adapters it has.",
                             "Resume it without changing {model.lora_predictor}, or start "
                             "a new run.")
        return saved

    def _resume_checks(self, found: Run, saved: dict[str, Any], cfg: TrainConfig) -> None:
        """A resume with nothing left to train is refused; what the caller changed (from the
        `saved` config) is said."""
        refuse_finished(found, cfg.run.steps)
        self.resumed_changes = resume_changes(saved, cfg.to_dict())
        for change in self.resumed_changes:
            self.emitter.log(change["message"], level="warning")

    def _write_config(self, cfg: TrainConfig) -> None:
        """The run's resolved config, with where each value came from."""
        Run(self.run_dir).write_config({**cfg.to_dict(), PROVENANCE_KEY: self.provenance})

    # -- plan ---------------------------------------------------------------------------------
    def plan(self) -> Any:
        assert self.cfg is not None and self.voice is not None
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
            cfg = self.cfg = resolved(cfg, plan, self.provenance)
        # dry runs show it as their result; real runs keep it for --json consumers
        self.emitter.log(plan.table(), level="debug")
        self.plan_result = plan
        if req.dry_run:
            return plan
        if not plan.fits:  # the plan's changes are the remedy
            raise refusal(plan)
        check_disk(self.run_dir, plan.checkpoint_bytes, cfg.run.keep_checkpoints,
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
        assert self.cfg is not None and v is not None
        if self.resumed_changes:
            record_resume(run_dir, self.resumed_changes)
        given = req.storage is not None and str(req.storage).strip() != ""
        target = storage_for(v, req.storage)
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
        self._write_config(self.cfg)
        # an instant voice prepared before any base was chosen speaks on this one from now
        record_instant_base(v.path, self.cfg.model.base)

    def launch(self, cluster: Any) -> Any:
        """Devices of an existing cluster, preflight, codes, then the Ray Train job."""

        assert self.cfg is not None and self.voice is not None and self.where is not None
        cfg, req, emitter, v, run_dir = (self.cfg, self.request, self.emitter, self.voice,
                                         self.run_dir)
        if cfg.parallel.use_gpu is None:
            # an existing cluster: its GPUs decide, one worker per GPU by default
            gpus = int(cluster.num_gpus)
            workers = cfg.parallel.workers if self.workers_given or not gpus else gpus
            cfg = cfg.replace(parallel={"use_gpu": gpus > 0, "workers": workers},
                              data={"batch_size": max(cfg.data.batch_size, workers)})
            self.provenance["parallel.use_gpu"] = "the cluster's GPUs"
            if not self.workers_given:
                self.provenance["parallel.workers"] = "the cluster's GPUs"
            self._write_config(cfg)
        if cfg.parallel.use_gpu and cluster.num_gpus < cfg.parallel.workers:
            raise InputError(f"You asked for {cfg.parallel.workers} workers but the cluster "
                             f"has {cluster.num_gpus:g} GPUs.",
                             f"Set {{parallel.workers}} to {int(cluster.num_gpus) or 1}.")

        same_model_path = True
        where = self.where
        if where.preflight:
            report = preflight_or_fail(where, self.model_dir, emitter)
            same_model_path = all(n.model.endswith("(same path as the driver)")
                                  for n in report.nodes)
            if cfg.parallel.use_gpu:
                gpu_plan = cluster_gpu_plan(report, self.model_dir, cfg, v.path, emitter)
                if gpu_plan is not None:
                    cfg = resolved(cfg, gpu_plan, self.provenance)
                    self.run_extra["plan_bytes"] = gpu_plan.total
                    self._write_config(cfg)
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
            threading.Thread(target=watch_stop, args=(self.stop, self.job),
                             daemon=True).start()
        return self.job

    # -- watch --------------------------------------------------------------------------------
    def watch(self) -> dict[str, Any]:
        """Until the job ends; then the run's summary."""
        assert self.job is not None
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
        assert self.voice is not None
        return write_adapter_voice(self.voice.path, self.run_dir.name, self.emitter, "run")



@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
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


def resolved(cfg: TrainConfig, plan: Any, provenance: dict[str, str] | None = None
             ) -> TrainConfig:
    """`cfg` with the plan's choice for every "auto" that memory decides: gradient
    reduction with accumulation ("last" or "every") and whether parameters stay
    gathered between micro-steps ("on" or "off"); `provenance` says so of each."""
    if plan.accum_reduce not in ("last", "every"):
        return cfg  # no accumulation: neither applies
    parallel: dict[str, Any] = {"accum_reduce": plan.accum_reduce}
    if cfg.parallel.keep_gathered == "auto":
        parallel["keep_gathered"] = "on" if plan.keep_gathered else "off"
    for name in parallel:
        if provenance is not None and getattr(cfg.parallel, name) == "auto":
            provenance[f"parallel.{name}"] = "the memory plan (auto)"
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
        raise refusal(plan, " the cluster's GPUs")
    return plan


def watch_stop(stop: threading.Event, launch: Any) -> None:
    while launch.running():
        if stop.wait(0.2):
            launch.request_stop()
            return

