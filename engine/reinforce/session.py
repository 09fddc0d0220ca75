"""The reinforce stage of a run, whole: `reinforce(ReinforceRequest(voice, run))`.

It starts from a checkpoint of the run (default: the evaluation's best, else the newest
training checkpoint), keeps that checkpoint frozen as the reference, and runs GRPO
iterations (`stage.Grpo`) on held-out sentences in the voice's language
(`layout.voice_prompts.unsaid_sentences`: never a text the voice said, nor an evaluation
sentence), scored by `reward.Scorer` (loaded once). Each iteration:
- its figures (reward, every term, KL, the groups' reward spread, clipped share) go to the
  run's metrics.jsonl as `kind: "reinforce"` rows (the Train page reads them) and out as
  `metric` events (split "reinforce");
- every `checkpoint_every` iterations, at the end and at a stop, a checkpoint of the same
  format as training's (`train.checkpoint.Checkpointer`: the trainable weights and the
  stage's AdamW state) goes into the run at step `stage_base + iteration`, where
  `stage_base` is the run's highest step when the stage began (no training step is ever
  overwritten). Its trainer.json says `stage: "reinforce"`, the iteration and the start,
  so export, speak, evaluate, compare and serve read it like any checkpoint, and the
  evaluation's best pick chooses across both stages;
- the stage keeps its own newest `keep_checkpoints`; it never deletes a training one.
`resume=True` continues from the stage's newest checkpoint (policy, optimizer, RNG; the
renders of iteration i are seeded by i, so they are drawn again the same). `cancel`
(the CLI sets it on SIGTERM) stops after the iteration under way and saves it.
A report lands in `<run>/reinforce/report.json`.

A LoRA run's stage trains its adapters only, on the frozen base (`models`); its
checkpoints hold the adapters as training's do, so export (an adapter voice too), speak,
evaluate and serve read them as they read the run's.

By default the stage runs in this process (CPU, or one GPU). With `workers` it runs on
Ray (`engine.reinforce.workers`): the update in training's Ray Train / FSDP2 workers,
launched by training's own launcher, rollouts and scoring in one actor on this node; a
worker lost mid-stage makes Ray restart the group (`max_failures`), which continues from the
stage's newest checkpoint.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.cluster import connect
from engine.config.reinforce import ReinforceConfig
from engine.config.train import TrainConfig
from engine.core.atomic import write_json
from engine.core.errors import InputError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.jsonl import append_jsonl
from engine.core.storage import rmtree
from engine.layout import run as run_layout
from engine.layout.checkpoints import (
    REINFORCE_STAGE,
    TRAINER_STATE,
    checkpoint_stage,
    step_of,
)
from engine.layout.run import Run
from engine.layout.voice import Voice, display_path, now_iso, open_voice
from engine.layout.voice_prompts import unsaid_sentences
from engine.model.loading import resolve_model
from engine.quality.evaluate import HELD_OUT_SENTENCES
from engine.reinforce.models import load_stage_models
from engine.reinforce.reward import TERMS, RewardContext, load_reward, reward_factory
from engine.reinforce.stage import Grpo, iteration_texts
from engine.reinforce.workers import Rollouts, reinforce_loop
from engine.train.checkpoint import Checkpointer
from engine.train.export import write_adapter_voice
from engine.train.launch import Launch, LaunchSpec


@dataclass(frozen=True)
class ReinforceRequest:
    """What to reinforce, from the CLI and the API alike.

    run: a run name or folder (default: the latest with a checkpoint). checkpoint: the
    start (a step or name; default the evaluation's best, else the newest training
    checkpoint). config: the stage's settings (default: the voice's [reinforce]).
    resume: continue the stage's newest checkpoint. asr: a recogniser spec or a loaded
    one. device: where the policy and the scorers run (default: the CPU). workers: the
    update in that many Ray Train workers (`engine.reinforce.workers`).
    """

    voice: Voice | str | os.PathLike[str]
    run: str | None = None
    checkpoint: str | None = None
    config: ReinforceConfig | None = None
    resume: bool = False
    asr: Any = None
    device: str | None = None
    #: Ray Train workers of the policy update (None or 0: the stage in this process)
    workers: int | None = None
    #: an existing Ray cluster (host:port); None: a private local one (with `workers`)
    address: str | None = None
    #: with `workers`: worker-group restarts after a lost worker, each from the stage's
    #: newest checkpoint (as training's `max_failures`)
    max_failures: int = 2


def stage_checkpoints(run: Run) -> list[Any]:
    """The run's checkpoints the reinforce stage wrote, oldest first."""
    return [c for c in run.checkpoints() if checkpoint_stage(c) == REINFORCE_STAGE]


def _trainer_state(checkpoint: Any) -> dict[str, Any]:
    return json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))


def _start_checkpoint(run: Run, which: str | None, em: Emitter) -> Any:
    if which:
        return run.find_checkpoint(which)
    found = run.reinforce_start()
    if found is None:
        raise WorkspaceError(f"The run {run.name} has no training checkpoint to reinforce.",
                             "Train the voice first (`voxshard-engine train`).")
    start, best = found
    em.log(f"Starting from step {step_of(start)}, the evaluation's best." if best else
           f"No evaluation yet; starting from the newest checkpoint, step {step_of(start)}.")
    return start


@dataclass
class _Plan:
    """Where the stage starts and where it writes."""

    start: Any  # the checkpoint the policy starts from (and the reference stays)
    base: int  # the run's highest step when the stage began
    done: int  # iterations already made (resume)
    resume_from: Any  # the stage's checkpoint to continue, or None


def _plan(run: Run, request: ReinforceRequest, em: Emitter) -> _Plan:
    own = stage_checkpoints(run)
    if request.resume and own:
        state = _trainer_state(own[-1])
        start = run.checkpoint(int(state["from_step"]))
        if start is None:
            raise WorkspaceError(f"The checkpoint the stage started from (step "
                                 f"{state['from_step']}) is gone, so it cannot be resumed.",
                                 "Start the stage again without --resume.")
        em.log(f"Resuming the reinforce stage at iteration {state['iteration']} "
               f"({own[-1].name}).")
        return _Plan(start, int(state["stage_base"]), int(state["iteration"]), own[-1])
    if own and not request.resume:
        raise InputError(f"The run {run.name} already has a reinforce stage (up to "
                         f"{own[-1].name}).", "Continue it with --resume, or reinforce "
                         "another run.")
    start = _start_checkpoint(run, request.checkpoint, em)
    return _Plan(start, max(run.steps() or [0]), 0, None)


def _trainable(run: Run, workers: int | None = None) -> str:
    """What the stage trains: what the run trained (a LoRA run: its adapters only)."""
    model = run.config().get("model") or {}
    trainable = str(model.get("trainable") or "talker")
    if trainable == "lora" and workers:
        raise InputError(f"The run {run.name} trained LoRA adapters, which the reinforce "
                         "stage updates in this process only, not on Ray workers.",
                         "Reinforce it in the engine's own process (no "
                         "{parallel.workers}).")
    return trainable


def held_out_texts(voice: Voice) -> list[str]:
    """The stage's prompts: sentences the voice never said, in its language, minus the
    evaluation's (the stage must not train on what measures it)."""
    texts = unsaid_sentences(voice, exclude=HELD_OUT_SENTENCES)
    if not texts:
        raise WorkspaceError(f"There is no held-out sentence in {voice.language} for the "
                             "reinforce stage (every bundled prompt was recorded).",
                             "Add a prompt set in the voice's language (assets/prompts).")
    return texts


class _Stage:
    """The stage in this process: models, scorer, GRPO, checkpointer."""

    def __init__(self, voice: Voice, run: Run, plan: _Plan, cfg: ReinforceConfig,
                 request: ReinforceRequest, em: Emitter) -> None:
        self.voice, self.run, self.plan, self.cfg, self.em = voice, run, plan, cfg, em
        self.models = load_stage_models(voice, run, plan.start, _trainable(run),
                                        request.device or "cpu", cfg.seed)
        em.state("loading", detail="the reward (by default the recogniser and the speaker "
                                   "encoder)")
        reward = load_reward(RewardContext(voice, run.path, cfg, self.models, request.asr,
                                           request.device, em))
        self.policy = self.models.policy
        self.grpo = Grpo(self.policy, self.models.reference, self.models.roller, reward, cfg)
        self.checkpointer = Checkpointer(run.path, rank=0, world_size=1)
        if plan.resume_from is not None:
            self.checkpointer.load(plan.resume_from, self.policy, self.grpo.optimizer, None)

    def step_of(self, iteration: int) -> int:
        return self.plan.base + iteration

    def save(self, iteration: int) -> Path:
        path = self.checkpointer.save(
            self.step_of(iteration), self.policy, self.grpo.optimizer, None,
            {"iteration": iteration}, extra={**_stage_state(self.plan, self.cfg),
                                             "iteration": iteration})
        prune_stage(self.run)
        self.em.artifact(str(path), role="checkpoint", step=self.step_of(iteration))
        return path

    def run_all(self, pool: list[str], cancel: threading.Event | None
                ) -> tuple[Any, bool, int]:
        """The iterations left; (last saved checkpoint, stopped, iterations done)."""
        cfg, run, em = self.cfg, self.run, self.em
        saved, stopped, done = self.plan.resume_from, False, self.plan.done
        for it in range(self.plan.done, int(cfg.iterations)):
            if cancel is not None and cancel.is_set():
                stopped = True
                break
            row = self.grpo.iteration(it, iteration_texts(pool, cfg, it))
            done = it + 1
            values = {f"reinforce/{k}": v for k, v in row.items() if k != "iteration"}
            step = self.step_of(done)
            append_jsonl(run.metrics_file, {"kind": "reinforce", "time": round(time.time(), 3),
                                            "step": step, "iteration": done, **values})
            em.metric({"step": step, "iteration": done, **values}, split="reinforce")
            em.progress("reinforce", done, int(cfg.iterations))
            last = done == cfg.iterations or (cancel is not None and cancel.is_set())
            if done % int(cfg.checkpoint_every) == 0 or last:
                saved = self.save(done)
        if stopped and done > self.plan.done and step_of(saved) != self.step_of(done):
            saved = self.save(done)
        self.checkpointer.close()
        return saved, stopped, done


def _stage_state(plan: _Plan, cfg: ReinforceConfig) -> dict[str, Any]:
    """What a stage checkpoint's trainer.json says besides its iteration."""
    return {"stage": REINFORCE_STAGE, "from_step": step_of(plan.start),
            "stage_base": plan.base, "reinforce": cfg.to_dict()}


def prune_stage(run: Run) -> None:
    """The stage's own newest `keep_checkpoints` stay; training's are never touched."""
    own = stage_checkpoints(run)
    for old in own[: max(0, len(own) - run.keep_checkpoints())]:
        rmtree(old)


def _on_ray(voice: Voice, run: Run, plan: _Plan, cfg: ReinforceConfig,
            request: ReinforceRequest, pool: list[str], em: Emitter,
            cancel: threading.Event | None) -> tuple[Any, bool, int]:
    """The stage on Ray (`engine.reinforce.workers`): the update in `request.workers` Ray
    Train workers, rollouts and scoring in one actor on this node; (last saved checkpoint,
    stopped, iterations done)."""
    workers = int(request.workers or 1)
    if (cfg.prompts * cfg.group) % workers:
        raise InputError(f"{cfg.prompts} x {cfg.group} renders per iteration do not split "
                         f"evenly over {workers} workers.",
                         "Choose {reinforce.prompts} and {reinforce.group} whose product "
                         "the workers divide.")
    trained = TrainConfig.from_dict(run.config())
    use_gpu = bool(request.device and request.device.startswith("cuda"))
    config = trained.replace(
        parallel={"workers": workers, "use_gpu": use_gpu, "address": request.address},
        data={"batch_size": max(trained.data.batch_size, workers)},
        # the launcher prunes to this; the stage prunes only its own (`prune_stage`)
        run={"keep_checkpoints": 1 << 30})
    cluster = connect(request.address, num_cpus=max(workers, 2), on_event=em)
    actor = None
    try:
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(),
                                              soft=False)
        em.state("loading", detail="the rollout actor (model, recogniser, speaker encoder)")
        # num_cpus=0: the workers hold the CPUs the cluster has; the actor works between
        # their updates
        actor = ray.remote(num_cpus=0)(Rollouts).options(scheduling_strategy=here).remote(
            {"reinforce": cfg.to_dict(), "voice_dir": str(voice.path), "run_dir": str(run.path),
             "start": str(plan.start), "trainable": _trainable(run), "asr": request.asr})
        base_dir = resolve_model(str(run.base_model()), download=False)
        spec = LaunchSpec(config=config.to_dict(), run_dir=run.path,
                          total_steps=int(cfg.iterations), workers=workers, use_gpu=use_gpu,
                          max_failures=int(request.max_failures), loop=reinforce_loop,
                          extra={"model_dir": str(base_dir), "trainable": _trainable(run),
                                 "reinforce": cfg.to_dict(), "start": str(plan.start),
                                 "resume_from": (str(plan.resume_from)
                                                 if plan.resume_from is not None else None),
                                 "done": plan.done, "base": plan.base, "texts": pool,
                                 "state": _stage_state(plan, cfg), "actor": actor})
        launch = Launch(spec, em).start()
        watching = threading.Event()

        def watch() -> None:
            while not watching.wait(0.2):
                if cancel is not None and cancel.is_set():
                    launch.request_stop()
                    return

        watcher = threading.Thread(target=watch, name="reinforce-stop", daemon=True)
        watcher.start()
        try:
            result = launch.wait()
        finally:
            watching.set()
            watcher.join()
    finally:
        if actor is not None:
            ray.kill(actor)
        cluster.close()
    prune_stage(run)
    own = stage_checkpoints(run)
    saved = own[-1] if own else None
    done = int(_trainer_state(saved)["iteration"]) if saved is not None else plan.done
    return saved, result.stopped, done


def reinforce(request: ReinforceRequest, on_event: EventCallback | Emitter | None = None,
              cancel: threading.Event | None = None) -> dict[str, Any]:
    """Run the stage (module doc); returns its report plus "summary" and "stopped"."""
    em = as_emitter(on_event)
    voice = request.voice if isinstance(request.voice, Voice) else open_voice(request.voice)
    run = run_layout.pick_run(voice.path, request.run, with_checkpoint=True)
    if run is None:
        raise WorkspaceError(f"The voice {voice.path.name} has no run with a checkpoint to "
                             "reinforce.", "Train it first with `voxshard-engine train`.",
                             window_hint="Train the voice first.")
    cfg = request.config or voice.reinforce_config
    reward_factory(cfg.reward)  # a reward that cannot load is refused before any cluster
    _trainable(run, request.workers)  # refused before anything is loaded
    plan = _plan(run, request, em)
    pool = held_out_texts(voice)
    where = f"{request.workers} Ray worker(s)" if request.workers else "one process"
    em.state("reinforcing", detail=f"{run.name}: from step {step_of(plan.start)}, "
                                   f"{cfg.iterations} iteration(s) on {where}")
    started = time.perf_counter()
    if request.workers:
        saved, stopped, done = _on_ray(voice, run, plan, cfg, request, pool, em, cancel)
    else:
        saved, stopped, done = _Stage(voice, run, plan, cfg, request, em).run_all(pool, cancel)
    history = [r for r in run.metrics() if r.get("kind") == "reinforce"
               and int(r.get("iteration", 0)) <= done]
    # a resumed stage repeats the iterations after its last checkpoint: the later row counts
    history = list({int(r["iteration"]): r for r in history}.values())
    stopped = stopped or done < cfg.iterations
    out = _report(run, plan, cfg, history, saved, stopped, time.perf_counter() - started, em)
    if _trainable(run) == "lora" and saved is not None and not stopped:
        made = _adapter_voice(voice, run, em)
        if made is not None:
            out["adapter_voice"] = made
            out["summary"] += f"\nAdapter voice {Path(made['out_dir']).name} ready to speak."
    return out


def _adapter_voice(voice: Voice, run: Run, em: Emitter) -> dict[str, Any] | None:
    """A finished LoRA stage rewrites the run's adapter voice as a finished LoRA run
    writes it (the evaluation's best, else the newest checkpoint: now the stage's), so
    `speak VOICE` and `serve` take the reinforced voice."""
    return write_adapter_voice(voice.path, run.name, em, "stage")


def _report(run: Run, plan: _Plan, cfg: ReinforceConfig, history: list[dict[str, Any]],
            saved: Any, stopped: bool, elapsed: float, em: Emitter) -> dict[str, Any]:
    def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        return round(float(np.mean(vals)), 4) if vals else None

    head, tail = history[:5], history[-5:]
    figures = {k: {"first": mean(f"reinforce/{k}", head), "last": mean(f"reinforce/{k}", tail)}
               for k in ("reward", *TERMS, "runaway", "kl", "reward_spread")}
    report = {
        "created": now_iso(), "run": run.name, "from_step": step_of(plan.start),
        "iterations": len(history), "stopped": stopped,
        "checkpoint": str(saved) if saved is not None else None,
        "step": step_of(saved) if saved is not None else None,
        "config": cfg.to_dict(), "elapsed_s": round(elapsed, 1), "figures": figures,
        "history": history,
    }
    write_json(run.reinforce_report, report)
    em.artifact(str(run.reinforce_report), role="reinforce_report")
    r = figures["reward"]
    lines = [f"Reinforced run {run.name} from step {report['from_step']}: "
             f"{len(history)} iteration(s){' (stopped)' if stopped else ''}.",
             f"  reward {r['first']} -> {r['last']} (mean of the first and last five), "
             f"KL {figures['kl']['last']}, similarity {figures['similarity']['last']}, "
             f"WER {figures['wer']['last']}.",
             f"  checkpoint: {display_path(Path(saved)) if saved is not None else '-'}",
             f"Report: {display_path(run.reinforce_report)}"]
    return {**report, "summary": "\n".join(lines), "path": str(run.reinforce_report)}
