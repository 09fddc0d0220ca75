"""What a reader needs to know about a workspace and its voices, from the engine's own layout.

The window and `voxshard-engine status` read through this module, so there is
one reading of the folders the engine writes, a view over `engine.layout`: takes
through `Voice`, runs and their checkpoints through `Run`, a run's total steps
where the trainer records them. Light: no torch, no Qt (the GUI imports it).

Reading is tolerant: a file not written yet, or damaged, leaves a field empty
instead of failing the whole read. Everything returned is plain data that a
background thread can hand to the window and `to_dict()` can print as JSON.
"""

from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.atomic import read_json
from engine.core.errors import VoxshardError
from engine.layout import exports as layout_exports
from engine.layout.checkpoints import step_of
from engine.layout.exports import EXPORT_INFO, EXPORTS_DIR, RENDERS_DIR, renders_dir
from engine.layout.manifest import (
    PREPARED,
    SpeechCount,
    prepared_folder,
    read_manifest,
    read_report,
    reference_clip,
    row_is_usable,
)
from engine.layout.run import RUNS_DIR, Run, voice_base_model
from engine.layout.run import list_runs as _run_folders
from engine.layout.tiers import voice_tiers
from engine.layout.voice import VERDICT_UNUSABLE, VOICE_FILE, TakeCache, open_voice
from engine.layout.voice import list_voices as _voice_folders
from engine.model.loading import check_base_model, local_model_path
from engine.synth.voice import folder_instruct_note, styles_at

__all__ = ["ExportInfo", "RunInfo", "SourceStyles", "TakeInfo", "VoiceEntry", "VoiceSnapshot",
           "base_model_problem", "change_signature", "comparisons", "is_current",
           "latest_run", "list_exports", "list_renders", "list_runs", "list_takes", "list_tiers",
           "list_voices", "prepared_clips", "quality_report", "run_progress", "snapshot",
           "source_styles", "speaker_name", "voice_summary", "workspace_status"]

#: a snapshot taken this soon after a change it read may have missed a second one
RACY_NS = 2_000_000_000


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)  # a storage Location (checkpoints in an object store) prints as its URI


# --- the workspace ------------------------------------------------------------------------

@dataclass
class VoiceEntry:
    """One voice folder of a workspace, as a list shows it."""

    path: Path
    speaker: str  # the name a person gave (display name), else the speaker key
    language: str

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(self.__dict__)


def _voice_table(voice: Path) -> dict[str, Any]:
    try:
        with (voice / VOICE_FILE).open("rb") as fh:
            table = tomllib.load(fh).get("voice")
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return table if isinstance(table, dict) else {}


def speaker_name(voice: str | os.PathLike[str]) -> str:
    """The voice's display name (what the person typed), else its speaker key, else the folder."""
    table = _voice_table(Path(voice))
    for key in ("display_name", "speaker"):
        value = table.get(key)
        if isinstance(value, str) and value:
            return value
    return Path(voice).name


def list_voices(workspace: str | os.PathLike[str]) -> list[VoiceEntry]:
    """The voices directly inside a workspace, by folder name (case-insensitive)."""
    try:
        folders = _voice_folders(workspace)
    except OSError:
        return []
    out = []
    for path in sorted(folders, key=lambda p: p.name.lower()):
        table = _voice_table(path)
        out.append(VoiceEntry(path, speaker_name(path), str(table.get("language") or "")))
    return out


# --- takes and their prepare verdicts -----------------------------------------------------

@dataclass
class TakeInfo:
    """A take with what prepare said about it (`usable` is None before prepare)."""

    id: str
    path: Path
    text: str
    duration_s: float
    origin: str  # "recorded" | "imported"
    source: str | None  # where an imported file came from
    prompt_id: str | None
    excluded: bool
    extra: dict[str, Any] = field(default_factory=dict)
    usable: bool | None = None
    issues: list[dict[str, Any]] = field(default_factory=list)
    #: seconds of speech the take counts while in use (engine.layout.manifest.SpeechCount)
    speech_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(self.__dict__)


def minutes_in_use(takes: list[TakeInfo]) -> float:
    """Minutes of speech the takes in use count toward the recommendation (one rule:
    `SpeechCount`; the prepare report's usable minutes once they are prepared)."""
    return sum(t.speech_s for t in takes if not t.excluded) / 60.0


def prepared_clips(voice: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The prepare manifest, every row: one dict per clip (id, path, text, usable, issues,
    source_take); `engine.layout.manifest.row_is_usable` says which ones train."""
    return read_manifest(voice, usable_only=False, strict=False)


def quality_report(voice: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_report(voice)


def _take_infos(takes: list[Any], clips: list[dict[str, Any]],
                report: dict[str, Any] | None) -> list[TakeInfo]:
    by_take: dict[str, list[dict[str, Any]]] = {}
    for clip in clips:
        by_take.setdefault(str(clip.get("source_take") or ""), []).append(clip)
    rejected = {str(r.get("take")): r for r in (report or {}).get("rejected") or []
                if isinstance(r, dict)}
    count = SpeechCount.of(clips, report)
    out = []
    for t in takes:
        info = TakeInfo(id=t.id, path=t.audio_path, text=t.text,
                        duration_s=float(t.duration_s or 0.0), origin=t.origin,
                        source=t.source, prompt_id=t.prompt_id,
                        excluded=bool(t.extra.get("excluded")), extra=dict(t.extra),
                        speech_s=count.seconds(t.id, t.sha256, t.duration_s,
                                               t.verdict == VERDICT_UNUSABLE))
        mine = by_take.get(t.id)
        if mine:
            info.usable = any(row_is_usable(c) for c in mine)
            for c in mine:
                info.issues.extend(i for i in c.get("issues") or [] if isinstance(i, dict))
        elif t.id in rejected and not (rejected[t.id].get("code") == "excluded"
                                       and not info.excluded):
            # (a take left out then and ticked since has no verdict until it is prepared)
            r = rejected[t.id]
            info.usable = False
            info.issues.append({"code": r.get("code"), "message": r.get("reason")})
        out.append(info)
    return out


def list_takes(voice: str | os.PathLike[str]) -> list[TakeInfo]:
    """Every complete take, oldest id first, with its prepare verdict and issues."""
    v = open_voice(voice)
    return _take_infos(v.list_takes(), prepared_clips(v.path), quality_report(v.path))


# --- runs ---------------------------------------------------------------------------------

@dataclass
class RunInfo:
    """A training run folder: its complete checkpoints and where it stands."""

    name: str
    path: Path
    checkpoints: list[Any]  # complete ones, oldest first (Paths; Locations for a URI)
    metrics_file: Path
    config: dict[str, Any]  # the resolved TrainConfig the run was started with
    total_steps: int | None  # None: not known yet (no metric written, steps from epochs)
    last_step: int | None  # the latest step in metrics.jsonl
    #: `Run.recency` when read: what makes a run "the latest" (`latest_run`)
    recency: tuple[float, str] = (0.0, "")
    #: the checkpoint its evaluation judged best (`Run.best`: training's while it keeps
    #: it, else the copy under best/); None: not evaluated, or gone
    best: Any = None

    @property
    def best_step(self) -> int | None:
        return step_of(self.best) if self.best is not None else None

    @property
    def checkpoint_steps(self) -> list[int]:
        return [step_of(p) or 0 for p in self.checkpoints]

    def to_dict(self) -> dict[str, Any]:
        d = _jsonable(self.__dict__)
        d["checkpoint_steps"] = self.checkpoint_steps
        d["best_step"] = self.best_step
        return d


def run_progress(run_dir: str | os.PathLike[str]) -> tuple[int | None, int | None]:
    """(total steps, latest step) of a run, as `engine.layout.run.Run.progress` reads them
    (the total: `run.steps` of the saved config, else what its metrics carry)."""
    progress = Run(Path(run_dir)).progress(elapsed=False)
    return progress.total, progress.step


@dataclass(frozen=True)
class SourceStyles:
    """What a source speaks with an instruction: the styles it was trained with, and the
    engine's warning for one given to it (None: it takes one)."""

    styles: list[str]
    warning: str | None


def source_styles(folder: str | os.PathLike[str] | None) -> SourceStyles:
    """`SourceStyles` of a checkpoint, adapter voice or export folder (None: a zero-shot or
    instant voice), read from its records without loading a model; a folder gone or
    unreadable has none."""
    path = Path(folder) if folder is not None else None
    try:
        note = folder_instruct_note(path)
        return SourceStyles(styles_at(path) if path is not None else [],
                            note.message if note is not None else None)
    except (VoxshardError, OSError):
        return SourceStyles([], None)


def base_model_problem(base: str) -> tuple[str, str] | None:
    """Why what a user chose as the base model cannot be trained from (message, what to
    do), as training itself would say it; None when it can, or when it is a hub id (the
    engine downloads it). A local folder is judged by its config files only."""
    if not base.strip():
        return "No base model is chosen.", "Choose a hub model or a local model folder."
    path = local_model_path(base)
    if path is None:
        return None
    try:
        check_base_model(path)
    except VoxshardError as exc:
        return exc.message, exc.hint or ""
    return None


def list_runs(voice: str | os.PathLike[str]) -> list[RunInfo]:
    """Every run folder of a voice, by name (run names start with their date)."""
    runs = []
    for run in _run_folders(voice):
        total, last = run_progress(run.path)
        try:
            ckpts = run.checkpoints()
            best = run.best()
        except Exception:  # remote storage unreachable, a link file damaged: none to show
            ckpts, best = [], None
        runs.append(RunInfo(run.name, run.path, ckpts, run.metrics_file, run.config(), total,
                            last, run.recency(), best))
    return runs


def latest_run(runs: list[RunInfo], with_checkpoint: bool = False) -> RunInfo | None:
    """The run a command means when none is named, as `engine.layout.run.pick_run`
    decides it: the most recently trained (with a complete checkpoint, if asked)."""
    return max((r for r in runs if r.checkpoints or not with_checkpoint),
               key=lambda r: r.recency, default=None)


# --- exports and renders ------------------------------------------------------------------

@dataclass
class ExportInfo:
    name: str
    path: Path
    info: dict[str, Any]  # VOXSHARD_EXPORT.json: run, checkpoint, speaker (when written)

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(self.__dict__)


def list_exports(voice: str | os.PathLike[str]) -> list[ExportInfo]:
    """Exported model folders (complete ones: the export renames them in when done)."""
    out = []
    for d in sorted(layout_exports.list_exports(voice), key=lambda p: p.name):
        info = read_json(d / EXPORT_INFO)
        out.append(ExportInfo(d.name, d, info if isinstance(info, dict) else {}))
    return out


def list_renders(voice: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rendered WAVs, newest first, each with its sidecar JSON's fields, `path` and `mtime`."""
    folder = renders_dir(voice)
    items: list[dict[str, Any]] = []
    try:
        wavs = list(folder.glob("*.wav"))
    except OSError:
        return items
    for wav in wavs:
        try:
            mtime = wav.stat().st_mtime
        except OSError:
            continue
        meta = read_json(wav.with_suffix(".json"))
        entry: dict[str, Any] = dict(meta) if isinstance(meta, dict) else {}
        entry["path"] = wav
        entry["mtime"] = mtime
        items.append(entry)
    items.sort(key=lambda e: e["mtime"], reverse=True)
    return items


def comparisons(voice: str | os.PathLike[str]) -> list[Path]:
    """Finished checkpoint comparisons (folders with an index.json), oldest first."""
    return layout_exports.comparisons(voice)


# --- one voice, everything ---------------------------------------------------------------

@dataclass
class VoiceSnapshot:
    """Everything the window shows about one voice, read in one pass."""

    path: Path
    speaker: str  # display name
    speaker_key: str
    language: str
    prompt_set: str
    summary: dict[str, Any]  # Voice.summary(): totals, prepared, verdict, problems
    takes: list[TakeInfo]
    clips: list[dict[str, Any]]
    report: dict[str, Any] | None
    runs: list[RunInfo]
    exports: list[ExportInfo]
    renders: list[dict[str, Any]]
    comparisons: list[Path] = field(default_factory=list)
    #: the clip a zero-shot preview clones and training takes the speaker from
    #: (engine.layout.manifest.reference_clip: the CLI's `compare` uses the same)
    reference: Path | None = None
    #: the base model a zero-shot preview uses when none is chosen
    #: (engine.layout.run.voice_base_model)
    base_model: str | None = None
    signature: tuple[tuple[str, int, int], ...] = ()
    read_at_ns: int = 0  # wall clock when the signature was taken
    #: the groups of the prompt set chosen to read (Voice.prompt_groups; empty: all)
    prompt_groups: tuple[str, ...] = ()
    #: the voice's [prepare] settings over the defaults (Voice.prepare_settings)
    prepare_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def minutes_in_use(self) -> float:
        return minutes_in_use(self.takes)

    @property
    def minutes_recorded(self) -> float:
        """Minutes of every take, unrounded: shown beside `minutes_in_use` with the same
        rounding (the summary's, already rounded, read 0.1 beside 0.2 for one 9 s take)."""
        return sum(t.duration_s or 0.0 for t in self.takes) / 60.0

    @property
    def usable_minutes(self) -> float | None:
        prep = self.summary.get("prepared") or {}
        value = prep.get("minutes_usable")
        return float(value) if isinstance(value, int | float) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "speaker": self.speaker, "speaker_key": self.speaker_key,
            "language": self.language, "prompt_set": self.prompt_set,
            "prompt_groups": list(self.prompt_groups), "summary": _jsonable(self.summary),
            "takes": [t.to_dict() for t in self.takes], "clips": _jsonable(self.clips),
            "report": _jsonable(self.report), "runs": [r.to_dict() for r in self.runs],
            "exports": [e.to_dict() for e in self.exports],
            "renders": _jsonable(self.renders),
            "comparisons": [str(c) for c in self.comparisons],
            "reference": str(self.reference) if self.reference is not None else None,
            "base_model": self.base_model,
        }


def snapshot(voice: str | os.PathLike[str], take_cache: TakeCache | None = None
             ) -> VoiceSnapshot:
    """Read a whole voice. Raises WorkspaceError when the folder is not a voice.

    `take_cache` (see `Voice.scan`) makes a re-read of a big voice cost one
    stat per take instead of one JSON parse per take.
    """
    read_at = time.time_ns()
    sig = change_signature(voice)  # first: a change during the read makes the next one differ
    v = open_voice(voice)
    takes, problems = v.scan(take_cache)
    summary = v.summary((takes, problems))
    clips = prepared_clips(v.path)
    report = quality_report(v.path)
    runs, exports, renders = list_runs(v.path), list_exports(v.path), list_renders(v.path)
    summary.update(runs=len(runs), exports=len(exports), renders=len(renders),
                   tiers=list_tiers(v.path))
    return VoiceSnapshot(
        path=v.path, speaker=v.display_name, speaker_key=v.speaker, language=v.language,
        prompt_set=v.prompt_set, summary=summary, takes=_take_infos(takes, clips, report),
        clips=clips, report=report, runs=runs, exports=exports, renders=renders,
        comparisons=comparisons(v.path), reference=reference_clip(v.path, clips, report),
        base_model=voice_base_model(v.path), prompt_groups=tuple(v.prompt_groups),
        prepare_settings=v.prepare_settings, signature=sig, read_at_ns=read_at)


def voice_summary(voice: str | os.PathLike[str]) -> dict[str, Any]:
    """Totals, readiness verdict, counts of runs, exports and renders, and its tiers."""
    v = open_voice(voice)
    out = v.summary()
    out.update(runs=len(list_runs(v.path)), exports=len(list_exports(v.path)),
               renders=len(list_renders(v.path)), tiers=list_tiers(v.path))
    return out


def list_tiers(voice: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What the voice speaks with, by tier (instant, adapter, full), with each one's size
    on disk and base model (`engine.layout.tiers.voice_tiers`)."""
    return [_jsonable(t.to_dict()) for t in voice_tiers(voice)]


def _stamp(key: str, path: Path) -> tuple[str, int, int]:
    try:
        st = path.stat()
    except OSError:
        return (key, 0, -1)
    return (key, st.st_mtime_ns, st.st_size)


def change_signature(voice: str | os.PathLike[str]) -> tuple[tuple[str, int, int], ...]:
    """Cheap proof of change: (what, mtime, size) of the folders and files a snapshot reads.

    Takes are written by rename into takes/, so its own time changes with every
    add, delete or edit; checkpoints appear (or complete) inside run folders.
    metrics.jsonl is left out on purpose: it grows every step of a live run.
    """
    root = Path(voice)
    parts = [_stamp(VOICE_FILE, root / VOICE_FILE)]
    parts += [_stamp(sub or ".", root / sub)
              for sub in ("", "takes", PREPARED, RUNS_DIR, EXPORTS_DIR, RENDERS_DIR)]
    prepared = prepared_folder(root)
    # the codes index: training records the reference clip there (VoiceSnapshot.reference)
    parts += [_stamp(path.relative_to(root).as_posix(), path)
              for path in (prepared.report, prepared.manifest, prepared.codes_index)]
    for run in _run_folders(root):
        config = run.config_file
        parts += [_stamp(run.name, run.path),
                  _stamp(f"{run.name}/{config.name}", config)]
        try:
            parts += [_stamp(f"{run.name}/{c.name}", c) for c in sorted(run.path.iterdir())
                      if step_of(c) is not None]
        except OSError:
            pass
    return tuple(parts)


def is_current(snap: VoiceSnapshot) -> bool:
    """Whether a snapshot still shows the disk, without reading it again.

    Two writes within one tick of the file system's clock can leave a folder's
    time unchanged, so a snapshot taken while anything it read was that young
    is never trusted (the same rule as git's "racily clean" index entries).
    """
    if change_signature(snap.path) != snap.signature:
        return False
    newest = max((mtime for _key, mtime, _size in snap.signature), default=0)
    return newest < snap.read_at_ns - RACY_NS


def workspace_status(workspace: str | os.PathLike[str]) -> dict[str, Any]:
    """Each voice of a workspace with its summary (a damaged one says why)."""
    voices = []
    for entry in list_voices(workspace):
        row = entry.to_dict()
        try:
            row["summary"] = _jsonable(voice_summary(entry.path))
        except VoxshardError as exc:
            row["error"] = exc.message
        voices.append(row)
    return {"workspace": str(Path(workspace)), "voices": voices}
