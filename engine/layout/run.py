"""A training run on disk, and which run a command means when the user names none.

```
<voice>/runs/<run>/config.json                the resolved TrainConfig, rewritten at every start
<voice>/runs/<run>/metrics.jsonl              one JSON record per logged step (appended live)
<voice>/runs/<run>/checkpoint_step_NNNNNNN/   checkpoints (engine.layout.checkpoints)
<voice>/runs/<run>/checkpoints.jsonl          every checkpoint training completed, pruned or
                                              not (the evaluation accounts for each one)
<voice>/runs/<run>/best/<checkpoint>/         the evaluation's best, kept from pruning
<voice>/runs/<run>/held/<checkpoint>/         what the evaluation is measuring, held from it
<voice>/runs/<run>/evaluation/evaluation.json what `evaluate` measured (and report.html)
```

A run's checkpoints may live elsewhere (a shared folder the run folder links to, or
an object store its `storage.json` names); config and metrics always stay here.

Where a run stands (`Run.progress`, `ProgressReader`): its step, its step count and its
training time, read from metrics.jsonl and config.json. Elapsed is the sum over the first
start and every resume: each start's first record carries `perf/build_s` (the model's
build, before its first step), so a start counts from its build to its last record. The
window's selector, cards and status and the command line's `status` all read it here.

Which run, when none is named (`pick_run`): the one trained most recently, judged
by when training last wrote to it (`Run.last_active`: its config, written at every
start and resume; its metrics, appended every logged step; its newest complete
checkpoint). Resuming an old run makes it the latest; evaluating or exporting one
does not (they write elsewhere). A command that needs a checkpoint (speak, compare,
evaluate, export) passes over runs that have none yet, e.g. one that crashed before
its first save. Light: no torch, no Ray (the GUI reads this).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config.layers import PROVENANCE_KEY
from engine.core.atomic import read_json, write_json
from engine.core.errors import InputError, WorkspaceError
from engine.core.jsonl import append_jsonl, read_jsonl
from engine.core.kinds import VoiceKind, parse_kind
from engine.layout.checkpoints import (
    COMPLETE,
    MIN_KEEP,
    REINFORCE_STAGE,
    TRAINER_STATE,
    checkpoint_at,
    checkpoint_name,
    checkpoint_stage,
    hold,
    keep_best,
    kept_best,
    list_checkpoints,
    listing_root,
    release,
    step_of,
)

RUNS_DIR = "runs"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
EVALUATION_DIR = "evaluation"
EVALUATION_FILE = "evaluation.json"
REPORT_FILE = "report.html"
#: the reinforce stage's report of a run: <run>/reinforce/report.json
REINFORCE_DIR = "reinforce"
#: the data a run trains on: its fingerprint and the clip its speaker came from
DATA_FILE = "data.json"
#: one line per checkpoint training completed (its name and step), kept after pruning
WRITTEN_FILE = "checkpoints.jsonl"
#: bytes read from the end of metrics.jsonl for the latest records (long runs are big)
TAIL_BYTES = 256 * 1024


def runs_dir(voice_dir: str | os.PathLike[str]) -> Path:
    return Path(voice_dir) / RUNS_DIR


def _records(lines: list[bytes] | list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a torn last line of a file being written
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


@dataclass(frozen=True)
class Progress:
    """Where a run stands, as its files say."""

    step: int | None = None  # the latest step training logged
    total: int | None = None  # the run's step count: config `run.steps`, else the metrics'
    #: training time (s): from each start's model build to its last record, summed
    elapsed_s: float | None = None
    last_time: float | None = None  # wall time of the latest record (seconds since the epoch)

    def done(self, total: int | None = None) -> bool:
        """Every step of `total` (default: the run's own count) is logged."""
        total = self.total if total is None else total
        return self.step is not None and bool(total) and self.step >= int(total or 0)

    def elapsed_at(self, now: float) -> float | None:
        """Elapsed while the run is still training: up to `now`, not only its last record."""
        if self.elapsed_s is None or self.last_time is None:
            return self.elapsed_s
        return self.elapsed_s + max(0.0, now - self.last_time)


class ProgressReader:
    """A run's `Progress`, read as metrics.jsonl grows: each `read` parses only the bytes
    added since the last one (at most `max_bytes` of them; `caught_up` says whether the
    end was reached), so a window can follow a live run of any length cheaply."""

    def __init__(self, run: Run, *, tail_bytes: int | None = None) -> None:
        self.run = run
        self._tail = tail_bytes  # only the last bytes (step and total; no elapsed)
        self._reset()
        self.caught_up = False

    def _reset(self) -> None:
        self._offset = 0
        self._partial = b""
        self._step: int | None = None
        self._seen_total: int | None = None
        self._closed = 0.0  # elapsed of the starts before the latest
        #: the latest start: its first step, build time (wall clock), latest record
        self._start: list[Any] | None = None

    def read(self, max_bytes: int | None = None) -> Progress:
        self.caught_up = True
        try:
            with self.run.metrics_file.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size < self._offset:  # replaced or truncated: read it anew
                    self._reset()
                if self._tail is not None and self._offset == 0 and size > self._tail:
                    self._offset = size - self._tail
                    fh.seek(self._offset)
                    fh.readline()  # the first line of the window is cut
                    self._offset = fh.tell()
                fh.seek(self._offset)
                chunk = fh.read(max_bytes if max_bytes is not None else -1)
        except OSError:
            chunk = b""
        self._offset += len(chunk)
        if max_bytes is not None and len(chunk) == max_bytes:
            self.caught_up = False
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for rec in _records(lines):
            self._add(rec)
        return self.progress()

    def _add(self, rec: dict[str, Any]) -> None:
        if rec.get("kind") == REINFORCE_STAGE:
            # the reinforce stage's rows (step: the run's last + iteration) are not training
            # steps: counted here, a run of 20 steps read "step 23 of 20"
            return
        step = rec.get("step")
        if isinstance(step, int):
            self._step = step
        total = rec.get("total_steps")
        if isinstance(total, int) and total > 0:
            self._seen_total = total
        when = _number(rec.get("time"))
        if when is None or self._tail is not None:
            return
        build = _number(rec.get("perf/build_s"))
        # what came before a start's first record: the model's build and that first step
        lead = (build or 0.0) + (_number(rec.get("perf/step_s")) or 0.0)
        start = self._start
        if start is not None and build is not None and step == start[0]:
            start[1] = min(start[1], when - lead)  # another rank's first record of it
        elif start is None or build is not None:
            if start is not None:  # a resume (or a recovery): the previous start is done
                self._closed += start[2] - start[1]
            self._start = [step, when - lead, when]
            return
        self._start[2] = max(self._start[2], when)  # type: ignore[index]

    def progress(self) -> Progress:
        run_cfg = self.run.config().get("run")
        configured = run_cfg.get("steps") if isinstance(run_cfg, dict) else None
        total = configured if isinstance(configured, int) and configured > 0 \
            else self._seen_total
        start = self._start
        return Progress(step=self._step, total=total,
                        elapsed_s=None if start is None else self._closed + start[2] - start[1],
                        last_time=None if start is None else start[2])


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def read_evaluation(path: Path) -> dict[str, Any] | None:
    """An evaluation.json (None: none yet), each entry's kind read as a `VoiceKind`; an
    entry of a kind this version does not know is refused in one sentence."""
    data = read_json(path)
    if not isinstance(data, dict):
        return None
    for entry in data.get("entries") or []:
        if isinstance(entry, dict) and "kind" in entry:
            entry["kind"] = parse_kind(VoiceKind, entry["kind"], f"An entry of {path}")
    return data


@dataclass(frozen=True)
class Run:
    """One run folder. Cheap to create; every read goes to disk."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def voice_dir(self) -> Path | None:
        """The voice this run belongs to (None for a run folder outside `<voice>/runs/`)."""
        voice = self.path.parent.parent
        return voice if self.path.parent.name == RUNS_DIR and voice.is_dir() else None

    # -- config and metrics -------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    def config(self) -> dict[str, Any]:
        """The resolved config the run was (last) started with; {} when missing or damaged."""
        data = read_json(self.config_file)
        return _settings(data) if isinstance(data, dict) else {}

    def read_config(self) -> dict[str, Any]:
        """The saved config for a command that cannot go on without it."""
        data = read_json(self.config_file)
        if not isinstance(data, dict):
            raise WorkspaceError(f"The run {self.name} has no readable {CONFIG_FILE}.",
                                 "Start a new run; this one cannot be continued or exported.")
        return _settings(data)

    def provenance(self) -> dict[str, str]:
        """Where each value of the saved config came from ({"optim.lr": "the preset for
        0.6B"}, `engine.config.layers`); {} for a run from before it was kept."""
        data = read_json(self.config_file)
        found = data.get(PROVENANCE_KEY) if isinstance(data, dict) else None
        return found if isinstance(found, dict) else {}

    def write_config(self, config: dict[str, Any]) -> None:
        write_json(self.config_file, config)

    def metrics(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl, oldest first (a damaged line is skipped)."""
        try:
            return _records(self.metrics_file.read_bytes().split(b"\n"))
        except OSError:
            return []

    def recent_metrics(self, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
        """The last complete records of metrics.jsonl, which may be long and still growing."""
        try:
            with self.metrics_file.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - max_bytes))
                chunk = fh.read()
        except OSError:
            return []
        lines = chunk.split(b"\n")
        if size > max_bytes:
            lines = lines[1:]  # the first line of the window is cut
        return _records(lines)

    def progress(self, *, elapsed: bool = True) -> Progress:
        """Step, step count and (with `elapsed`) training time. Without it only the end of
        metrics.jsonl is read: what a list of many long runs needs."""
        return ProgressReader(self, tail_bytes=None if elapsed else TAIL_BYTES).read()

    def finished(self, total: int | None = None) -> bool:
        """Trained to its end: its newest complete checkpoint is at the last of `total`
        steps (default: its own saved step count). Resume has nothing left to do."""
        if total is None:
            total = self.progress(elapsed=False).total
        try:
            latest = self.latest()
        except Exception:  # remote storage unreachable: nothing known to be finished
            latest = None
        step = step_of(latest) if latest is not None else None
        return bool(total) and step is not None and step >= int(total or 0)

    def base_model(self) -> str | None:
        """The base model the run trained from: its saved config, else its newest
        checkpoint's trainer state (runs from before the config was saved whole)."""
        candidates = sorted(self.path.glob("*.json"))
        latest = self.latest()
        if isinstance(latest, Path):
            candidates.append(latest / TRAINER_STATE)
        for path in candidates:
            data = read_json(path)
            if not isinstance(data, dict):
                continue
            for holder in (data, data.get("config"), data.get("train_config")):
                if isinstance(holder, dict):
                    model = holder.get("model")
                    if isinstance(model, dict) and model.get("base"):
                        return str(model["base"])
                    if holder.get("base_model"):
                        return str(holder["base_model"])
        return None

    def speaker_name(self) -> str | None:
        """The speaker key the run trained (its config's `model.speaker_name`)."""
        for path in sorted(self.path.glob("*.json")):
            data = read_json(path)
            model = data.get("model") if isinstance(data, dict) else None
            if isinstance(model, dict) and model.get("speaker_name"):
                return str(model["speaker_name"])
        return None

    # -- checkpoints -------------------------------------------------------------------
    def checkpoints(self) -> list[Any]:
        """Complete checkpoints, oldest first (`Path`s; `Location`s in an object store)."""
        return list_checkpoints(self.path)

    def latest(self) -> Any:
        found = self.checkpoints()
        return found[-1] if found else None

    def checkpoint(self, step: int) -> Any:
        """The complete checkpoint of `step`, kept by training or as the evaluation's best
        (`checkpoints.checkpoint_at`; None: never written, torn, or pruned)."""
        return checkpoint_at(self.path, step)

    def steps(self) -> list[int]:
        """Every step a checkpoint can be had for: training's and the kept best's."""
        found = {step_of(c) for c in self.checkpoints()}
        best = self.best()
        if best is not None:
            found.add(step_of(best))
        return sorted(s for s in found if s is not None)

    def find_checkpoint(self, which: str | None) -> Any:
        """A checkpoint by name, step number (`checkpoint`: training's or the kept best),
        folder path, or "latest"/None."""
        text = str(which or "")
        direct = Path(text).expanduser()
        if text and direct.is_dir() and step_of(direct) is not None:
            return direct
        found = self.checkpoints()
        if not found:
            raise WorkspaceError(f"The run {self.path} has no complete checkpoint yet.",
                                 "Train longer (a checkpoint is written every few hundred "
                                 "steps).")
        if text in ("", "latest"):
            return found[-1]
        step = int(text) if text.isdigit() else step_of(text)
        ckpt = self.checkpoint(step) if step is not None else None
        if ckpt is not None:
            return ckpt
        steps = ", ".join(str(s) for s in self.steps())
        raise InputError(f"The run {self.name} has no checkpoint {text!r}.",
                         f"Available steps: {steps} (or 'latest').",
                         window_hint=f"Its checkpoints are at steps {steps}.")

    def record_written(self, name: str) -> None:
        """Training completed checkpoint `name` (the driver's record, written whatever
        pruning does to the checkpoint later)."""
        append_jsonl(self.path / WRITTEN_FILE, {"checkpoint": name, "step": step_of(name)})

    def written(self) -> dict[str, int]:
        """Every checkpoint training recorded as completed, name -> step (empty for a run
        from before the record was kept: its listing is then all there is)."""
        rows = read_jsonl(self.path / WRITTEN_FILE)  # tolerant: none yet is empty
        return {str(r["checkpoint"]): int(r["step"]) for r in rows
                if r.get("checkpoint") and isinstance(r.get("step"), int)}

    # -- evaluation and the kept best --------------------------------------------------
    @property
    def evaluation_dir(self) -> Path:
        return self.path / EVALUATION_DIR

    @property
    def reinforce_report(self) -> Path:
        """The reinforce stage's report (its iterations' figures, where it started)."""
        return self.path / REINFORCE_DIR / "report.json"

    @property
    def evaluation_file(self) -> Path:
        return self.evaluation_dir / EVALUATION_FILE

    @property
    def report_file(self) -> Path:
        return self.evaluation_dir / REPORT_FILE

    def evaluation(self) -> dict[str, Any] | None:
        return read_evaluation(self.evaluation_file)

    def trained_styles(self) -> list[str]:
        """The style descriptions the run trained with (data.json; [] for none or old runs)."""
        data = read_json(self.path / DATA_FILE)
        styles = data.get("styles") if isinstance(data, dict) else None
        return [str(s) for s in styles] if isinstance(styles, list) else []

    def recorded_reference(self) -> str | None:
        """The prepared clip the run's speaker x-vector came from (data.json), if recorded."""
        data = read_json(self.path / DATA_FILE)
        ref = data.get("reference_clip") if isinstance(data, dict) else None
        return ref if isinstance(ref, str) and ref else None

    def best(self) -> Any:
        """The checkpoint the run's evaluation judged best (None: not evaluated, or gone):
        the live one while training keeps it, then the copy `keep_best` made."""
        best = (self.evaluation() or {}).get("best")
        step = best.get("step") if isinstance(best, dict) else None
        if not isinstance(step, int):
            return None
        try:
            return self.checkpoint(step)
        except OSError:  # remote storage unreachable: the kept copy is local
            return kept_best(self.path, checkpoint_name(step))

    def reinforce_start(self) -> tuple[Any, bool] | None:
        """The checkpoint a new reinforce stage starts from, and whether it is the
        evaluation's best (else the newest training checkpoint); None: nothing trained."""
        best = self.best()
        if best is not None and checkpoint_stage(best) != REINFORCE_STAGE:
            return best, True
        trained = [c for c in self.checkpoints() if checkpoint_stage(c) != REINFORCE_STAGE]
        return (trained[-1], False) if trained else None

    def resume_refusal(self) -> InputError | None:
        """Why training cannot resume this run, or None: it went on into the reinforce stage.
        Both stages share one step numbering (the stage's checkpoints come after training's
        highest step), so from its newest checkpoint training would take the stage's weights
        and AdamW state for its own, and from its newest training one its steps would land
        on the stage's numbers."""
        stage = [c for c in self.checkpoints() if checkpoint_stage(c) == REINFORCE_STAGE]
        if not stage:
            return None
        return InputError(f"The run {self.name} went on into the reinforce stage (up to "
                          f"{stage[-1].name}), so its training cannot be resumed.",
                          "Start a new run to train more, or continue the stage with "
                          "`voxshard-engine reinforce --resume`.",
                          window_hint="Start a new run to train more, or press Resume on "
                                      "the Reinforce tab.")

    def keep_best(self, checkpoint: str | os.PathLike[str]) -> Path | None:
        return keep_best(self.path, checkpoint)

    def keep_checkpoints(self) -> int:
        """How many checkpoints training keeps (its config's `run.keep_checkpoints`)."""
        run = self.config().get("run")
        keep = run.get("keep_checkpoints") if isinstance(run, dict) else None
        return keep if isinstance(keep, int) and keep >= MIN_KEEP else MIN_KEEP

    def hold(self, checkpoint: Any) -> Path | None:
        """A copy of `checkpoint` pruning cannot delete, for a measurement (`hold`)."""
        if not isinstance(checkpoint, Path):
            return None  # an object store: measured while it lasts
        return hold(self.path, checkpoint, self.keep_checkpoints())

    def release(self, name: str | None = None) -> None:
        release(self.path, name)

    # -- which run -----------------------------------------------------------------------
    def last_active(self) -> float:
        """When training last wrote to this run (seconds since the epoch).

        Only local files are looked at (a checkpoint in an object store is not stat'ed:
        its metrics are written here at the same time). A folder with none of them
        (a start that failed at once) counts from its own time.
        """
        stamps = [_mtime(self.config_file), _mtime(self.metrics_file)]
        try:
            latest = self.latest() if isinstance(listing_root(self.path), Path) else None
        except OSError:
            latest = None
        if latest is not None:
            stamps.append(_mtime(latest / COMPLETE))
        known = [s for s in stamps if s is not None]
        return max(known) if known else (_mtime(self.path) or 0.0)

    def recency(self) -> tuple[float, str]:
        """The sort key of "the latest run": last activity, then the name (run names
        start with their start time) for runs active in the same instant."""
        return (self.last_active(), self.name)


def list_runs(voice_dir: str | os.PathLike[str]) -> list[Run]:
    """Every run folder of a voice, by name."""
    try:
        return [Run(p) for p in sorted(runs_dir(voice_dir).iterdir()) if p.is_dir()]
    except OSError:
        return []


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """A saved config without its provenance: the config tree alone."""
    return {k: v for k, v in config.items() if k != PROVENANCE_KEY}


def pick_run(voice_dir: str | os.PathLike[str], name: str | os.PathLike[str] | None = None,
             *, with_checkpoint: bool = False) -> Run | None:
    """The run a command means: the one named (a run name, or a run folder's path), else
    the one trained most recently (`Run.recency`); with `with_checkpoint`, the most
    recent that has a complete checkpoint. None when there is no such run.

    A named run is returned whether or not it has checkpoints: the caller says what is
    missing. A run kept in a shared folder that this machine does not see is an error
    of its own ("there is no run" would be wrong).
    """
    if name is not None and str(name) != "":
        link = runs_dir(voice_dir) / name
        if link.is_symlink() and not link.exists():
            raise InputError(f"Run {link.name} lives in {os.readlink(link)}, which this "
                             "machine cannot see.",
                             "Mount the shared storage folder, then try again.")
        if link.is_dir():
            return Run(link)
        direct = Path(name).expanduser()
        return Run(direct) if direct.is_dir() else None
    runs = list_runs(voice_dir)
    if with_checkpoint:
        runs = [r for r in runs if _has_checkpoint(r)]
    return max(runs, key=Run.recency, default=None)


def voice_base_model(voice_dir: str | os.PathLike[str]) -> str | None:
    """The base model a voice trained from, for a zero-shot preview given no base: that
    of its latest run with a checkpoint, else of its latest run (one still before its
    first save trained from the same base), as `Run.base_model` reads it."""
    run = pick_run(voice_dir, with_checkpoint=True) or pick_run(voice_dir)
    return run.base_model() if run is not None else None


def _has_checkpoint(run: Run) -> bool:
    try:
        return bool(run.checkpoints())
    except Exception:  # remote storage unreachable, a pointer damaged: nothing to use here
        return False
