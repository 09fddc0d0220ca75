"""Evaluating a run while it trains: `watch` measures each checkpoint as training writes
it, as a second engine process beside training (which never waits for it), holding each
new checkpoint from training's pruning until it is measured (`_Holds`). Each pass is one
`engine.quality.evaluate.evaluate` of the newest unmeasured checkpoint.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.config.evaluate import EvaluateConfig
from engine.core.errors import WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.process import alive
from engine.layout import run as run_layout
from engine.layout.checkpoints import HELD_MAX, evaluation_cover, step_of
from engine.layout.run import Run
from engine.layout.voice import Voice, open_voice
from engine.quality.evaluate import PRUNED, EvaluateRequest, evaluate, skip_note


def watch(request: EvaluateRequest, *, interval_s: float = 15.0, idle_s: float | None = None,
          training_pid: int | None = None,
          stop: threading.Event | None = None,
          on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Evaluate each checkpoint of a run as training writes it, in this process (start it
    as a second engine process beside training, which then never waits for it).

    The zero-shot clone (and the voice's export) is measured first, as soon as the run
    says its base model, so the baseline is there before the first checkpoint. Then the
    run is polled every `interval_s`: the newest unmeasured checkpoint is rendered and
    measured, one per pass, so a watcher slower than training falls behind gracefully
    (it always measures the newest; older ones it measures while they last). Training
    keeps only its newest checkpoints, so the watcher holds each one until it is measured
    (`Run.hold`: hard links pruning cannot take away; `_Holds`): a thread holds every new
    checkpoint as it appears, also while a long render runs (the baseline), at most
    `HELD_MAX` waiting (the oldest waiting is let go for a new one). Every checkpoint
    training wrote (`Run.written`, and what the thread saw) is measured, or skipped and
    noted in the report with why (pruned before it was held, or let go while the
    evaluation was behind); the watcher never stops for one. Training never waits for
    the watcher and keeps no checkpoint for it: the held copies are the watcher's, and
    cost disk only once training has deleted their originals (at most `HELD_MAX`
    checkpoints). `evaluation.json` and the report grow with every
    measured voice, and a `state` event `evaluation_updated` carries the best checkpoint
    so far. With `EvaluateConfig.patience`, a `state` event `early_stop_suggested` (and
    a warning) says when the best has not improved for that many evaluated checkpoints; stopping
    training stays the caller's decision. Returns the last evaluation when `stop` is
    set, when the watch is over (`watch_over`: every checkpoint measured or noted, and
    training's process `training_pid` gone or `idle_s` seconds idle), or on Ctrl-C
    (SIGTERM). `request.checkpoints` is the watcher's.
    """
    watcher = _Watcher(request, as_emitter(on_event))
    watcher.holds.start()
    try:
        while stop is None or not stop.is_set():
            # looked at before the pass: what an ended training wrote, the pass sees
            ended = training_pid is not None and not alive(training_pid)
            if watcher.one_pass():
                continue  # the next newest at once: training may be ahead
            if watch_over(watcher.unaccounted(), ended=ended, idle_for=watcher.idle_for(),
                          idle_s=idle_s):
                watcher.em.log("Every checkpoint training wrote is measured or noted; "
                               "stopped watching.")
                break
            if stop is not None:
                stop.wait(interval_s)
            else:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        watcher.em.log("Stopped watching.")
    finally:
        watcher.holds.close()
    if not watcher.result:
        name = watcher.run.name
        return {"run": name, "entries": [], "best": None,
                "summary": f"No checkpoint of {name} appeared while watching."}
    return watcher.result


def watch_over(unaccounted: list[str], *, ended: bool, idle_for: float,
               idle_s: float | None) -> bool:
    """Whether a watcher beside training is done, the one rule of the window's evaluation
    and `evaluate --watch`: no checkpoint training wrote is left `unaccounted` (neither
    measured nor noted as skipped), and training has ended (its process is gone: the
    window's, or --training-pid) or has been idle for longer than `idle_s` (--idle)."""
    if unaccounted:
        return False
    return ended or (idle_s is not None and idle_for > idle_s)




def _behind(n: int) -> str:
    return (f"the evaluation fell {n} checkpoints behind training, and holds at most "
            f"{HELD_MAX} waiting; training deleted this one before it was measured")


class _Holds:
    """The checkpoints a watcher holds from training's pruning (`Run.hold`): each new one as
    it appears, until it is measured, at most `HELD_MAX` of them (the oldest waiting one
    is let go for a new one; the newest are measured first). A thread looks every `poll_s`,
    also while a long render runs (the zero-shot baseline), and remembers every checkpoint
    it saw, so one written and pruned meanwhile is still named."""

    POLL_S = 0.2

    def __init__(self, run: Run) -> None:
        self.run = run
        self.copies: dict[str, Path] = {}  # checkpoint name -> its held copy
        self.busy: str | None = None  # being measured: never let go of before it is done
        self.done: set[str] = set()  # measured or noted: not worth holding
        self.seen: dict[str, int | None] = {}  # every checkpoint listed, by name
        self.dropped: dict[str, str] = {}  # let go before it was measured -> why
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="evaluate-holds", daemon=True)

    def start(self) -> None:
        self.run.release()  # what a watcher killed before left behind
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self.copies.clear()
            self.run.release()

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_S):
            try:
                self.hold_new()
            except OSError:  # a folder pruned while it was listed: the next look sees it
                continue

    def names(self) -> set[str]:
        with self._lock:
            return set(self.copies)

    def sightings(self) -> dict[str, int | None]:
        with self._lock:
            return dict(self.seen)

    def hold_new(self) -> None:
        """Hold every checkpoint not measured yet and not held; past `HELD_MAX`, let go of
        the oldest waiting ones (not the one being measured)."""
        with self._lock:
            found = self.run.checkpoints()
            for c in found:
                self.seen.setdefault(c.name, step_of(c.name))
            for c in found:
                if c.name in self.done or c.name in self.copies or c.name in self.dropped:
                    continue
                copy = self.run.hold(c)
                if copy is not None:
                    self.copies[c.name] = copy
            waiting = sorted((n for n in self.copies if n != self.busy),
                             key=lambda n: self.seen.get(n) or 0)
            behind = len(waiting) + (self.busy is not None)
            for name in waiting[:max(0, len(self.copies) - HELD_MAX)]:
                self.run.release(self.copies.pop(name).name)
                self.dropped[name] = _behind(behind)

    def take(self, name: str) -> Path | None:
        """The held copy of `name`, held now if the thread has not yet (None: it cannot be
        held: gone already, or in an object store); kept until `finish(name)`."""
        with self._lock:
            self.busy = name
            copy = self.copies.get(name)
            if copy is None:
                live = self.run.path / name
                copy = self.run.hold(live) if live.is_dir() else None
                if copy is not None:
                    self.copies[name] = copy
            return copy

    def finish(self, names: set[str]) -> None:
        """`names` are measured or noted: let go of their copies."""
        with self._lock:
            self.done |= names
            if self.busy in names:
                self.busy = None
            for name in names & set(self.copies):
                self.run.release(self.copies.pop(name).name)


class _Watcher:
    """What `watch` knows between its passes over the run."""

    def __init__(self, request: EvaluateRequest, em: Emitter) -> None:
        v = request.voice if isinstance(request.voice, Voice) else open_voice(request.voice)
        found = run_layout.pick_run(v.path, request.run)
        if found is None and not request.run:
            raise WorkspaceError(f"The voice {v.path.name} has no training run to watch.",
                                 "Start training first, or give --run.",
                                 window_hint="Press Start training first.")
        # a named run not there yet: the training just started creates it
        self.run = found if found is not None else v.run(str(request.run))
        self.request = replace(request, voice=v, run=str(self.run.path))
        self.em = em
        self.patience = (request.config or EvaluateConfig()).patience
        self.holds = _Holds(self.run)
        self.measured: set[str] = set()
        self.listed: dict[str, int | None] = {}  # every checkpoint seen, by name
        self.noted: set[str] = set()
        self.baseline = False
        self.result: dict[str, Any] = {}
        self.best_step: int | None = None
        self.since_best = 0
        self.suggested = False
        self.covered = False  # what it measures said
        self.last_new = time.monotonic()
        em.state("watching", detail=str(self.run.path))

    def idle_for(self) -> float:
        """Seconds since anything new: a checkpoint measured or noted, or a step training
        logged (a run still training is not idle, however long its next save takes). A
        run that has logged no step and written no checkpoint yet is starting (its
        workers may take minutes), not idle."""
        try:
            stat = self.run.metrics_file.stat()
            logged = time.time() - stat.st_mtime if stat.st_size else None
        except OSError:
            logged = None
        if logged is None and not self.listed:
            return 0.0
        return min(time.monotonic() - self.last_new, math.inf if logged is None else logged)

    def _say_cover(self) -> None:
        """What this evaluation measures, once the run's settings are saved (at its start)."""
        if self.covered:
            return
        settings = self.run.config().get("run")
        if isinstance(settings, dict) and settings:
            self.covered = True
            steps, every = settings.get("steps"), settings.get("checkpoint_every")
            self.em.log(evaluation_cover(steps if isinstance(steps, int) else None,
                                         every if isinstance(every, int) else None))

    def unaccounted(self) -> list[str]:
        """Checkpoints training wrote that are neither measured nor noted yet."""
        return [n for n in self.listed if n not in self.measured and n not in self.noted]

    def _available(self) -> set[str]:
        """Checkpoints that can still be measured: on disk, or held."""
        present = {c.name for c in self.run.checkpoints()}
        return present | self.holds.names()

    def one_pass(self) -> bool:
        """Measure what is new; True when the next pass should follow at once."""
        self._say_cover()
        available = self._available()
        # what training wrote: what the listing and the holding thread saw, and what
        # training recorded (one written and pruned between two looks included)
        for name, step in [*((n, step_of(n)) for n in available),
                           *self.holds.sightings().items(), *self.run.written().items()]:
            self.listed.setdefault(name, step)
        new = sorted(self.unaccounted(), key=lambda n: self.listed[n] or 0)
        todo = [n for n in new if n in available]
        if todo:
            self._measure_newest(todo)
            return True
        if not self.baseline and self.run.base_model():
            # the zero-shot baseline before the first checkpoint exists
            self.result = self._evaluate([], self._pruned())
            self.em.state("evaluation_updated", detail="baseline", best_step=None,
                          checkpoints=0, path=self.result["path"], skipped=len(self.noted))
            return True
        if new:
            notes = self._pruned()
            if notes and self.baseline:
                self.result = self._evaluate([], notes)  # the note lands in the report
        return False

    def _measure_newest(self, todo: list[str]) -> None:
        em = self.em
        self.last_new = time.monotonic()
        newest = todo[-1]
        if len(todo) > 1:
            em.log(f"Training is ahead of the evaluation: measuring {newest} first "
                   f"({len(todo) - 1} older checkpoint(s) wait while they last).")
        # the held copy: training may delete the original while it is measured
        source = self.holds.take(newest) or newest
        try:
            self.result = self._evaluate([str(source)], self._pruned())
        finally:
            self.holds.finish({newest} | self.noted)
        if newest not in self.noted:
            self.measured.add(newest)
        best = self.result.get("best") or {}
        if best.get("step") == self.best_step:
            self.since_best += 1
        else:
            self.best_step, self.since_best = best.get("step"), 0
        em.state("evaluation_updated", detail=f"best: {best.get('label')}",
                 best_step=self.best_step, checkpoints=len(self.measured),
                 path=self.result["path"], skipped=len(self.noted))
        if self.patience and self.since_best >= self.patience and not self.suggested:
            self.suggested = True
            em.log(f"The best checkpoint (step {self.best_step}) has not improved for "
                   f"{self.since_best} evaluated checkpoints: training longer is unlikely "
                   "to help.", level="warning")
            em.state("early_stop_suggested", best_step=self.best_step,
                     detail=f"no improvement for {self.since_best} checkpoints")

    def _pruned(self) -> list[dict[str, Any]]:
        """Checkpoints seen but deleted by training before this watcher held them."""
        available = self._available()
        gone = [n for n in self.listed
                if n not in self.measured and n not in available and n not in self.noted]
        for name in gone:
            self.em.log(f"{name} was deleted by training before it was measured; skipped "
                        "(noted in the report).", level="warning")
        return [skip_note(self.listed[n], n, self.holds.dropped.get(n, PRUNED))
                for n in gone]

    def _evaluate(self, checkpoints: list[str], notes: list[dict[str, Any]]) -> dict[str, Any]:
        first = not self.baseline
        out = evaluate(replace(self.request, checkpoints=checkpoints,
                               zero_shot=self.request.zero_shot and first,
                               export=self.request.export if first else False, skipped=notes),
                       on_event=self.em)
        self.baseline = True
        self.noted.update(n["checkpoint"] for n in out.get("skipped") or [])
        self.last_new = time.monotonic()  # idle means no new checkpoint, not a long evaluation
        return out
