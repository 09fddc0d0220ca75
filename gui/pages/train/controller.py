"""One training run seen from the window: the engine job, its events, its history.

The controller owns the run's `MetricsStore` and turns engine events into
what the page shows: a state line, log lines, per-worker processes (a second
start of a rank means Ray replaced the worker group after a failure), the
step total and an ETA. A finished run is read back from its metrics.jsonl in
slices, so a run of 100k steps loads without holding the window.

Endings are the job API's (gui/jobs.py): "Stopped" only when the engine
finished its stop (for training: saved a checkpoint); a stop that failed or
was forced is a failure, shown with the last complete checkpoint on disk.
Until the engine process has ended, the state says "Stopping" (or "Finishing"),
whoever asked for the stop (Stop, the status bar, Quit) and even after the
workers reported their last step: the engine still saves and shuts Ray down.

Step, step count and elapsed time are not counted here: the page reads them from
the run's folder (`engine.layout.run.ProgressReader`), as it does for a run after a
restart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from PySide6.QtCore import QObject, QTimer, Signal

from engine.layout.run import Run
from gui.jobs import EngineJob
from gui.metrics import MetricsStore

HISTORY_LINES_PER_SLICE = 2000

STATE_LABELS = {
    "starting_cluster": "Starting the Ray cluster",
    "loading_model": "Loading the base model",
    "extracting_codes": "Extracting codec codes",
    "sharding": "Sharding the model (FSDP2)",
    "training": "Training",
    "validating": "Validating",
    "checkpointing": "Saving a checkpoint",
    "recovering": "Recovering from a failed worker",
    "checkpoint": "Training (checkpoint saved)",
    "restarting": "Recovering from a failed worker",
    "worker_started": "Worker started",
    "x_vector": "Computing the speaker embedding",
    "preparing": "Preparing",
    "stopping": "Stopping: saving a checkpoint",
    "evaluating": "Evaluating a checkpoint",
    "finished": "Finished",
    "done": "Finished",
    "cancelled": "Stopped",
}
#: the workers' last word, said while the engine process still saves and shuts Ray down
ENDING_LABELS = {"stopped": "Stopping: step {step} saved, shutting down the cluster",
                 "finished": "Finishing: step {step} done, shutting down the cluster"}


class RunController(QObject):
    state_text = Signal(str)
    log = Signal(str, str)  # level, message
    ended = Signal(str, str)  # outcome ("succeeded" | "cancelled" | "failed"), summary
    history_loaded = Signal()
    best_changed = Signal(int)  # the evaluator's best checkpoint step
    early_stop = Signal(int)  # the best step, when it has not improved for `patience`
    run_known = Signal(object)  # the live run's folder, once the engine names it
    stopping = Signal()  # a stop of the live run was asked for (from anywhere)
    preflight = Signal(object)  # the engine's per-node preflight report
    #: a failed run's remedies: the engine's changes ({"path", "value", "why"} each)
    remedies = Signal(object)

    def __init__(self, store: MetricsStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.job: EngineJob | None = None
        self.total_steps = 0
        self.run_dir: Path | None = None
        self.worker_pids: dict[str, int] = {}  # rank -> pid of its current Ray worker
        self.workers: dict[str, dict[str, object]] = {}  # rank -> node, gpu, pid
        self._starts: dict[str, int] = {}  # worker starts per rank: >1 means a recovery
        self._train_t0: tuple[float, float] | None = None  # (time, step) at first step
        #: the workers said their last step ("stopped"/"finished"); the engine has not ended
        self.ending = False
        self.started_at = 0.0  # wall time the live job started (its records come after)
        self.metrics_seen = 0  # live metric events of this job
        self._history: TextIO | None = None
        self._held: list[dict] = []  # live metrics waiting for a resumed run's history
        self.evaluator: EngineJob | None = None
        self.best_step: int | None = None
        self.evaluated_step = -1  # the latest checkpoint step the evaluator measured

    # -- a live run -------------------------------------------------------------------
    def attach(self, job: EngineJob, total_steps: int, history: Path | None = None) -> None:
        """Follow a live run. `history` (a resumed run's metrics.jsonl) is read first, in
        slices; live metrics that arrive meanwhile wait, so the curve stays in step order."""
        self.close_history()
        self._held = []
        if history is not None:
            try:
                self._history = history.open(encoding="utf-8")
            except OSError:
                self._history = None
            else:
                QTimer.singleShot(0, self._read_history)
        self.run_dir = None
        self.job = job
        self.total_steps = total_steps
        self.worker_pids.clear()
        self.workers.clear()
        self._starts.clear()
        self._train_t0 = None
        self.ending = False
        self.started_at = time.time()
        self.metrics_seen = 0
        job.metric.connect(self._on_metric)
        job.state.connect(self._on_state)
        job.event.connect(self._on_raw_event)
        job.log.connect(self.log)
        job.progress.connect(self._on_progress)
        job.stop_requested.connect(self._on_stop_requested)
        job.succeeded.connect(lambda r: self._end("succeeded", str(r.get("summary") or "")))
        # the engine's own words say where it stopped and what it saved
        job.cancelled.connect(lambda: self._end(
            "cancelled", job.error[1] if job.error else "Stopped."))
        job.failed.connect(lambda _c, _m, _h: self.remedies.emit(list(job.changes)))
        job.failed.connect(lambda _c, m, h: self._end("failed", f"{m} {h}".strip()))
        self.state_text.emit("Starting…")

    def stop(self) -> str:
        """First press: ask the engine to save and stop. Second: force (kills)."""
        if self.job is None:
            return "idle"
        if self.job.stopping:
            self.job.force_stop()
            return "forced"
        self.job.cancel()  # says so through `_on_stop_requested`
        return "stopping"

    def _on_stop_requested(self) -> None:
        if not self.ending:
            self.state_text.emit(STATE_LABELS["stopping"])
        self.log.emit("info", "Stopping: the engine saves a checkpoint first; this can take "
                              "minutes for a large model. Press Stop again to force it.")
        self.stopping.emit()

    def _end(self, outcome: str, summary: str) -> None:
        if outcome == "failed" and self.run_dir is not None:
            last = Run(self.run_dir).latest()
            summary += (f" The last complete checkpoint is {last.name}; Resume continues "
                        "from it." if last is not None else " No checkpoint of this run "
                        "was completed.")
        self.job = None
        self.ending = False
        self.ended.emit(outcome, summary)

    def _on_metric(self, values: dict) -> None:
        self.metrics_seen += 1
        if self._history is not None and self.job is not None:
            self._held.append(values)  # after the resumed run's earlier steps
            return
        total = values.pop("total_steps", None)
        if isinstance(total, int) and total > 0:
            self.total_steps = total
        self.store.add(values)
        if self._train_t0 is None and "loss/train" in values:
            self._train_t0 = (time.monotonic(), self.store.last_step)

    def _on_raw_event(self, event: dict) -> None:
        # the engine's state events carry extras: the run's step count and folder
        if event.get("event") != "state":
            return
        if isinstance(event.get("total_steps"), int):
            self.total_steps = int(event["total_steps"])
        if isinstance(event.get("run"), str) and event["run"]:
            first = self.run_dir != Path(event["run"])
            self.run_dir = Path(event["run"])
            if first:
                self.run_known.emit(self.run_dir)
        if event.get("state") == "worker_started":
            rank = str(event.get("rank"))
            if isinstance(event.get("pid"), int):
                self.worker_pids[rank] = int(event["pid"])
        if event.get("state") == "worker_node":
            # where a rank runs (node name, the GPUs Ray gave it): the chart's labels
            gpus = event.get("gpus") or []
            self.workers[str(event.get("rank"))] = {
                "node": event.get("node"), "gpu": gpus[0] if len(gpus) == 1 else
                (",".join(map(str, gpus)) if gpus else None)}
        if event.get("state") == "preflight_done" and isinstance(event.get("report"), dict):
            self.preflight.emit(event["report"])

    def _on_state(self, state: str, detail: str) -> None:
        if state in ENDING_LABELS and self.job is not None:
            # rank 0's last step: the engine still saves and shuts Ray down, so the run
            # has not stopped until the process ends (`_end` says how it ended)
            self.ending = True
            step = detail.removeprefix("step ").strip() or "?"
            text = ENDING_LABELS[state].format(step=step)
            self.state_text.emit(text)
            self.log.emit("state", text)
            return
        if state == "worker_node":
            # where a rank runs ("rank 1 on vm GPU 0"): for the log, not the run's state
            rank, _, where = detail.removeprefix("rank ").partition(" on ")
            self.log.emit("state", f"Worker {rank} runs on {where}" if where else detail)
            return
        if state == "worker_started":
            rank = detail or "?"
            self._starts[rank] = self._starts.get(rank, 0) + 1
            if self._starts[rank] > 1:
                state, detail = "recovering", f"restart {self._starts[rank] - 1}"
            else:
                self.log.emit("state", f"Worker started ({rank})")
                return
        text = STATE_LABELS.get(state, state.replace("_", " ").capitalize())
        self.state_text.emit(text + (f" — {detail}" if detail else ""))
        self.log.emit("state", text + (f": {detail}" if detail else ""))

    def _on_progress(self, stage: str, _done: float, total: object) -> None:
        if stage in ("train", "training", "step") and isinstance(total, float) and total:
            self.total_steps = int(total)

    @property
    def training(self) -> bool:
        """A live run that still trains: not stopping, not past its last step."""
        return self.job is not None and not self.job.stopping and not self.ending

    def eta_s(self) -> float | None:
        if self._train_t0 is None or not self.total_steps or not self.training:
            return None
        t0, s0 = self._train_t0
        done = self.store.last_step - s0
        if done <= 0:
            return None
        return (time.monotonic() - t0) / done * max(0.0, self.total_steps - self.store.last_step)

    # -- evaluation beside training --------------------------------------------------------
    def attach_evaluator(self, job: EngineJob) -> None:
        """`evaluate --watch`: per-checkpoint similarity and word errors join the store."""
        self.evaluator = job
        self.best_step = None
        self.evaluated_step = -1
        job.event.connect(self._on_eval_event)
        job.finished.connect(lambda: setattr(self, "evaluator", None))

    def _on_eval_event(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "metric" and event.get("split") == "eval":
            self._on_eval_metric(event)
        elif kind == "state" and event.get("state") == "evaluation_updated":
            best = event.get("best_step")
            if isinstance(best, int) and best != self.best_step:
                self.best_step = best
                self.best_changed.emit(best)
                self.log.emit("info", f"Best checkpoint so far: step {best}")
        elif kind == "state" and event.get("state") == "early_stop_suggested":
            best = event.get("best_step")
            self.log.emit("warning", f"The best checkpoint (step {best}) has not improved "
                                     f"({event.get('detail', '')}).")
            if isinstance(best, int):
                self.early_stop.emit(best)

    def _on_eval_metric(self, event: dict, quiet: bool = False) -> None:
        values = event.get("values") or {}
        sim, wer = values.get("eval/similarity"), values.get("eval/wer")
        rate = values.get("eval/rate_ratio")
        source = event.get("source_kind")
        if source == "zero_shot":
            if isinstance(sim, int | float):
                self.store.latest["quality/similarity_zero_shot"] = float(sim)
            return
        step = event.get("step", values.get("step"))
        if source != "checkpoint" or not isinstance(step, int):
            return
        self.evaluated_step = max(self.evaluated_step, step)
        point: dict[str, object] = {"step": step}
        if isinstance(sim, int | float):
            point["quality/similarity"] = float(sim)
        if isinstance(wer, int | float):
            point["quality/wer"] = float(wer)
        # a point at its own step, without moving the run's step counter back or forth
        last = self.store.last_step
        self.store.add(point)
        self.store.last_step = last
        if quiet:  # a finished evaluation read back: its report has the warnings
            return
        zero = self.store.latest.get("quality/similarity_zero_shot")
        if isinstance(sim, int | float) and zero is not None and sim < zero - 0.02:
            self.log.emit("warning", f"Checkpoint {step} sounds less like the speaker than the "
                                     f"zero-shot clone (similarity {sim:.3f} < {zero:.3f}).")
        if isinstance(rate, int | float) and not 0.85 <= rate <= 1.15:
            self.log.emit("warning", f"Checkpoint {step} speaks at {rate:.2f} x the speaker's "
                                     "own rate: the speaking rate is drifting.")

    # -- a finished run ----------------------------------------------------------------
    def show_run(self, name: str, metrics_file: Path, total_steps: int | None,
                 on_line: Callable[[], None] | None = None) -> bool:
        """Read a run's metrics.jsonl into the store, in slices (runs can be long)."""
        self.close_history()
        try:
            fh = metrics_file.open(encoding="utf-8")
        except OSError:
            return False
        self._history = fh
        self.total_steps = total_steps or 0
        self.state_text.emit(f"Last run: {name}")
        self.log.emit("info", f"Showing {name} from {metrics_file}")
        self._read_history()
        return True

    def _add_record(self, line: str) -> int:
        try:
            rec = json.loads(line)
        except ValueError:
            return 0
        if not isinstance(rec, dict):
            return 0
        rec.pop("kind", None)
        rec.pop("time", None)
        total = rec.pop("total_steps", None)
        if isinstance(total, int) and total > 0:
            self.total_steps = total
        self.store.add(rec)
        return 1

    def close_history(self) -> None:
        if self._history is not None:
            self._history.close()
            self._history = None

    def _read_history(self) -> None:
        fh = self._history
        if fh is None:
            return
        for _ in range(HISTORY_LINES_PER_SLICE):
            line = fh.readline()
            if not line:
                self.close_history()
                held, self._held = self._held, []
                for values in held:
                    self._on_metric(values)
                self.history_loaded.emit()
                return
            self._add_record(line)
        QTimer.singleShot(0, self._read_history)
