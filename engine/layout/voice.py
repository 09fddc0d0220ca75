"""The voice workspace: one folder per voice, the filesystem is the database.

```
<voice>/voice.toml          speaker, language, settings
<voice>/takes/<id>.<ext>    raw audio, never modified once saved
<voice>/takes/<id>.json     transcript and metadata, written last
<voice>/prepared/           clips, manifest.jsonl, report.json (engine.layout.manifest)
<voice>/runs/ exports/ renders/
```

A take exists once its JSON exists: the audio is written first, the JSON
last, so a crash between the two leaves an orphan audio file that listing
ignores, never a take without audio. Every write goes through engine.core.atomic.
Imported takes keep their original container (`.mp3`, `.flac`...) because
their bytes are copied untouched; recorded takes are `.wav`.

This module is light: no torch, no Qt (the GUI uses it directly).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.io import copy_and_hash, probe, write_take_array
from engine.config import PrepareConfig
from engine.config.reinforce import ReinforceConfig
from engine.config.schema import SettingError
from engine.core.atomic import write_json, write_text
from engine.core.errors import AudioError, InputError, WorkspaceError
from engine.core.storage import storage_arg, user_path
from engine.layout.exports import EXPORTS_DIR, RENDERS_DIR, exports_dir, renders_dir
from engine.layout.manifest import PREPARED, PreparedFolder
from engine.layout.prompts import get_prompt_set, prompt_set_for_language
from engine.layout.run import RUNS_DIR, Run, list_runs, runs_dir
from engine.text import tidy_text

VOICE_FILE = "voice.toml"
FORMAT_VERSION = 1
TAKE_ID_RE = re.compile(r"^(\d{4,})(?:-[a-z0-9_-]+)?$")
RECOMMENDED_MINUTES = 10.0
#: a leftover in takes/ untouched this long belongs to no write still in progress
STALE_AFTER_S = 600.0
#: `engine.core.atomic` temporaries of take files: ".<take file name>.<random><suffix>"
_TEMP_RE = re.compile(r"^\.\d{4,}[^/]*\.")

#: prepare settings stored in voice.toml [prepare]; engine.prepare.pipeline reads them.
#: The fields, their meaning and their limits live in engine.config.PrepareConfig.
DEFAULT_PREPARE_SETTINGS: dict[str, Any] = PrepareConfig().to_dict()


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def safe_speaker_name(name: str) -> str:
    """Lowercase ASCII `[a-z0-9_]` form of a speaker name (the model's speaker key)."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    safe = re.sub(r"[^a-z0-9]+", "_", folded.lower()).strip("_")
    if not safe:
        raise InputError(f"The speaker name {name!r} has no letters or digits.",
                         "Use a name such as 'anna' or 'narrator_2'.")
    return safe[:64]


def slug(text: str, limit: int = 40) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", folded.lower()).strip("-")[:limit].strip("-")


def display_path(path: str | os.PathLike[str]) -> str:
    """A printable, JSON-safe form of a path (undecodable bytes become U+FFFD)."""
    raw = os.fsencode(path)
    return raw.decode("utf-8", "replace").replace("\n", "\\n").replace("\r", "\\r")


# --- a small TOML writer (tomllib only reads) -------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not np.isfinite(value):
            raise ValueError("TOML cannot hold NaN/inf settings")
        return repr(value)
    if isinstance(value, str):
        # a JSON string is a valid TOML basic string
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ValueError(f"cannot write {type(value).__name__} to voice.toml")


def dump_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        for key, value in values.items():
            if value is None:
                continue
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


# --- takes --------------------------------------------------------------------------------

#: a recorded take's verdict (`extra["verdict"]`), judged by the Record page as it was
#: recorded: "good"; "flagged" (advice only, it trains); "unusable" (silent, clipped or
#: cut off: it cannot train, and its prompt is offered again)
VERDICT_GOOD, VERDICT_FLAGGED, VERDICT_UNUSABLE = "good", "flagged", "unusable"
VERDICTS = (VERDICT_GOOD, VERDICT_FLAGGED, VERDICT_UNUSABLE)


def take_verdict(extra: Mapping[str, Any]) -> str:
    """The verdict a take's metadata carries; a take from before verdicts were written
    is "flagged" when it recorded warnings, else "good"."""
    verdict = extra.get("verdict")
    if verdict in VERDICTS:
        return str(verdict)
    return VERDICT_FLAGGED if extra.get("warnings") else VERDICT_GOOD


@dataclass(frozen=True)
class Take:
    """One saved recording and its metadata (the JSON sidecar)."""

    id: str
    audio_path: Path
    meta_path: Path
    text: str = ""
    prompt_id: str | None = None
    origin: str = "recorded"  # "recorded" | "imported"
    source: str | None = None
    created: str = ""
    duration_s: float | None = None
    sample_rate: int | None = None
    channels: int | None = None
    sha256: str = ""
    bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return take_verdict(self.extra)

    @property
    def fills_prompt(self) -> bool:
        """Whether the take's prompt counts as recorded (an unusable take's does not)."""
        return bool(self.prompt_id) and self.verdict != VERDICT_UNUSABLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "audio": self.audio_path.name, "text": self.text,
            "prompt_id": self.prompt_id, "origin": self.origin, "source": self.source,
            "created": self.created, "duration_s": self.duration_s,
            "sample_rate": self.sample_rate, "channels": self.channels,
            "sha256": self.sha256, "bytes": self.bytes, "extra": self.extra,
        }

    @staticmethod
    def from_meta(meta_path: Path) -> Take:
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
            audio = meta_path.parent / str(data["audio"])
            return Take(
                id=str(data["id"]), audio_path=audio, meta_path=meta_path,
                text=str(data.get("text") or ""), prompt_id=data.get("prompt_id"),
                origin=str(data.get("origin", "recorded")), source=data.get("source"),
                created=str(data.get("created", "")), duration_s=data.get("duration_s"),
                sample_rate=data.get("sample_rate"), channels=data.get("channels"),
                sha256=str(data.get("sha256", "")), bytes=int(data.get("bytes", 0)),
                extra=dict(data.get("extra") or {}),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WorkspaceError(f"The take metadata {meta_path.name} is damaged ({exc}).",
                                 "Delete the take or fix its JSON file.") from exc


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


#: sidecar file name -> ((mtime_ns, size), Take): what `Voice.scan` need not read again
TakeCache = dict[str, tuple[tuple[int, int], Take]]


# --- the voice ----------------------------------------------------------------------------

class Voice:
    """An open voice folder. Cheap to create; state lives on disk."""

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.config = config

    # layout
    @property
    def voice_file(self) -> Path:
        return self.path / VOICE_FILE

    @property
    def takes_dir(self) -> Path:
        return self.path / "takes"

    @property
    def prepared(self) -> PreparedFolder:
        """prepared/ and the names inside it (engine.layout.manifest)."""
        return PreparedFolder(self.path)

    @property
    def runs_dir(self) -> Path:
        return runs_dir(self.path)

    def run(self, name: str) -> Run:
        """The run folder `name` (it need not exist yet: a new run is created there)."""
        return Run(self.runs_dir / name)

    def runs(self) -> list[Run]:
        return list_runs(self.path)

    @property
    def exports_dir(self) -> Path:
        return exports_dir(self.path)

    @property
    def renders_dir(self) -> Path:
        return renders_dir(self.path)

    # settings
    @property
    def speaker(self) -> str:
        return str(self.config["voice"]["speaker"])

    @property
    def display_name(self) -> str:
        return str(self.config["voice"].get("display_name") or self.speaker)

    @property
    def language(self) -> str:
        return str(self.config["voice"].get("language", "english"))

    @property
    def prompt_set(self) -> str:
        return str(self.config["voice"].get("prompt_set", "english"))

    @property
    def prompt_groups(self) -> list[str]:
        """The groups of the prompt set to read ([voice] prompt_groups); empty: all of them."""
        groups = self.config["voice"].get("prompt_groups") or []
        return [str(g) for g in groups] if isinstance(groups, list) else []

    def set_prompts(self, prompt_set: str, groups: list[str] | None = None) -> None:
        """Choose the prompt set to read and, optionally, only some of its groups."""
        found = get_prompt_set(prompt_set)  # raises, naming the sets there are
        chosen = [g for g in found.groups if g in set(groups or [])]
        unknown = sorted(set(groups or []) - set(found.groups))
        if unknown:
            raise InputError(f"The prompt set {prompt_set!r} has no group "
                             f"{', '.join(map(repr, unknown))}.",
                             f"Choose from: {', '.join(found.groups)}.")
        table = self.config["voice"]
        table["prompt_set"] = found.name
        if chosen and len(chosen) < len(found.groups):
            table["prompt_groups"] = chosen
        else:
            table.pop("prompt_groups", None)  # every group: nothing to store
        self._save_config()

    @property
    def storage(self) -> str | None:
        """Where new training runs of this voice live ([train] storage in voice.toml):
        None for the voice's own runs/, else a shared folder or a URI (engine.core.storage)."""
        value = self.config.get("train", {}).get("storage")
        return str(value) if value else None

    def set_storage(self, storage: str | os.PathLike[str] | None) -> None:
        """Remember where new runs go (None or "" for the voice's own runs/)."""
        value = storage_arg(storage)
        table = self.config.setdefault("train", {})
        if value is None:
            table.pop("storage", None)
        else:
            table["storage"] = value
        if not table:
            self.config.pop("train", None)
        self._save_config()

    @property
    def prepare_settings(self) -> dict[str, Any]:
        merged = dict(DEFAULT_PREPARE_SETTINGS)
        merged.update(self.config.get("prepare", {}))
        return merged

    @property
    def prepare_config(self) -> PrepareConfig:
        """The voice's [prepare] settings over the defaults, validated."""
        return self.prepare_config_with({})

    @property
    def reinforce_config(self) -> ReinforceConfig:
        """The voice's [reinforce] settings over the defaults, validated."""
        try:
            return ReinforceConfig.from_dict(dict(self.config.get("reinforce", {})))
        except (TypeError, ValueError) as exc:
            raise WorkspaceError(f"{self.voice_file} has an invalid [reinforce] setting: "
                                 f"{exc}.", "Fix or remove that line of voice.toml.") from exc

    def _save_config(self) -> None:
        write_text(self.voice_file, dump_toml(self.config))

    def rename(self, speaker: str) -> None:
        """Change the speaker name (the folder stays where it is)."""
        self.config["voice"]["display_name"] = speaker.strip()
        self.config["voice"]["speaker"] = safe_speaker_name(speaker)
        self._save_config()

    @property
    def styles(self) -> list[str]:
        """The style descriptions of the voice's prepared clips (prepare writes them)."""
        styles = self.config["voice"].get("styles", [])
        return [str(x) for x in styles] if isinstance(styles, list) else []

    def set_styles(self, styles: list[str]) -> None:
        if styles != self.styles:
            self.config["voice"]["styles"] = list(styles)
            self._save_config()

    def set_language(self, language: str) -> None:
        self.config["voice"]["language"] = _check_language(language)
        self._save_config()

    def prepare_config_with(self, given: Mapping[str, Any]) -> PrepareConfig:
        """The settings of one prepare: `given` (the request's, by field name) over the
        voice's [prepare] over the defaults; InputError names a refused setting."""
        unknown = set(given) - set(DEFAULT_PREPARE_SETTINGS)
        if unknown:
            raise InputError(f"Unknown prepare setting(s): {', '.join(sorted(unknown))}.",
                             f"Known: {', '.join(DEFAULT_PREPARE_SETTINGS)}.")
        try:
            return PrepareConfig.from_dict({**self.prepare_settings, **given})
        except ValueError as exc:
            # a value of the request is refused as the request's (a setting as data: each
            # surface names it its way); one voice.toml holds, as that file's
            path = exc.path.rpartition(".")[2] if isinstance(exc, SettingError) else None
            if not given or (path is not None and path not in given):
                raise WorkspaceError(f"{self.voice_file} has an invalid [prepare] setting: "
                                     f"{exc}.", "Fix or remove that line of voice.toml.",
                                     ) from exc
            if isinstance(exc, SettingError):
                raise exc.as_input() from exc
            raise InputError(f"Invalid prepare setting: {exc}.") from exc

    def update_settings(self, **values: Any) -> None:
        """Keep `values` as the voice's [prepare] settings (checked first)."""
        self.prepare_config_with(values)
        self.config.setdefault("prepare", {}).update(values)
        self._save_config()

    # takes
    def _next_id(self, hint: str | None) -> tuple[str, int]:
        highest = 0
        if self.takes_dir.is_dir():
            for p in self.takes_dir.iterdir():
                m = TAKE_ID_RE.match(p.stem)
                if m:
                    highest = max(highest, int(m.group(1)))
        tail = slug(hint or "", 32)
        return (f"-{tail}" if tail else ""), highest + 1

    def _reserve(self, hint: str | None, suffix: str) -> tuple[str, Path]:
        """Claim a new take id by creating its audio file exclusively (no races)."""
        self.takes_dir.mkdir(parents=True, exist_ok=True)
        tail, n = self._next_id(hint)
        for _ in range(1000):
            take_id = f"{n:04d}{tail}"
            target = self.takes_dir / f"{take_id}{suffix}"
            try:
                fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                n += 1
                continue
            except OSError as exc:
                raise WorkspaceError(f"Cannot create a take in {self.takes_dir}: "
                                     f"{exc.strerror or exc}.") from exc
            os.close(fd)
            return take_id, target
        raise WorkspaceError(f"Cannot find a free take id in {self.takes_dir}.")

    def add_take(self, audio: np.ndarray | str | os.PathLike[str], text: str = "", *,
                 sample_rate: int | None = None, prompt_id: str | None = None,
                 source: str | None = None, extra: dict[str, Any] | None = None,
                 id_hint: str | None = None) -> Take:
        """Save a take: an audio array (recorded) or a file copied byte for byte (imported).

        Arrays are (samples,) or (samples, channels) float in [-1, 1] or int16.
        """
        if isinstance(audio, np.ndarray):
            if not sample_rate or sample_rate <= 0:
                raise InputError("A recorded take needs its sample rate.")
            if audio.size == 0:
                raise InputError("The recording is empty.")
            take_id, target = self._reserve(id_hint, ".wav")
            try:
                write_take_array(target, audio, sample_rate)
                info = probe(target)
                digest = file_sha256(target)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
            origin = "recorded"
        else:
            src = Path(audio)
            try:
                info = probe(src)
            except AudioError as exc:
                raise AudioError(f"{display_path(src.name)} {exc.message}.",
                                 "Choose a WAV, FLAC, OGG or MP3 file.") from exc
            suffix = src.suffix.lower() or ".wav"
            take_id, target = self._reserve(id_hint if id_hint is not None else src.stem,
                                            suffix)
            try:
                digest = copy_and_hash(src, target)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
            origin = "imported"
            source = source or display_path(src)
        take = Take(
            id=take_id, audio_path=target, meta_path=self.takes_dir / f"{take_id}.json",
            text=tidy_text(text), prompt_id=prompt_id, origin=origin, source=source,
            created=now_iso(), duration_s=round(info.duration_s, 4),
            sample_rate=info.sample_rate, channels=info.channels, sha256=digest,
            bytes=target.stat().st_size, extra=dict(extra or {}),
        )
        write_json(take.meta_path, take.to_dict())  # last: the take now exists
        return take

    def list_takes(self) -> list[Take]:
        """Every complete take, oldest id first. Damaged sidecars are skipped (see `problems`)."""
        return self._scan()[0]

    def problems(self) -> list[dict[str, str]]:
        """Takes whose metadata is damaged or whose audio is missing."""
        return self._scan()[1]

    def scan(self, cache: TakeCache | None = None) -> tuple[list[Take], list[dict[str, str]]]:
        """Takes and problems from one pass over takes/ (a reader needs both).

        With a `cache` (kept by the caller between scans of this voice), a
        sidecar whose size and time are unchanged is not read again.
        """
        return self._scan(cache)

    def _scan(self, cache: TakeCache | None = None
              ) -> tuple[list[Take], list[dict[str, str]]]:
        takes: list[Take] = []
        bad: list[dict[str, str]] = []
        if not self.takes_dir.is_dir():
            return takes, bad
        fresh: TakeCache = {}
        # trusted only when older than a clock tick or two: a same-size rewrite in the
        # same tick keeps size and time (git's "racily clean" rule)
        settled_ns = _dt.datetime.now().timestamp() * 1e9 - 2e9
        for meta in sorted(self.takes_dir.glob("*.json"), key=lambda p: p.name):
            try:
                if cache is None:
                    take = Take.from_meta(meta)
                else:
                    st = meta.stat()
                    stamp = (st.st_mtime_ns, st.st_size)
                    hit = cache.get(meta.name)
                    take = hit[1] if hit is not None and hit[0] == stamp \
                        else Take.from_meta(meta)
                    if st.st_mtime_ns < settled_ns:
                        fresh[meta.name] = (stamp, take)
            except FileNotFoundError:
                continue  # deleted while scanning
            except WorkspaceError as exc:
                bad.append({"take": meta.stem, "code": "damaged_metadata", "reason": exc.message})
                continue
            if not take.audio_path.is_file():
                bad.append({"take": take.id, "code": "missing_audio",
                            "reason": f"The audio file {take.audio_path.name} is missing."})
                continue
            takes.append(take)
        takes.sort(key=_take_sort_key)
        if cache is not None:
            cache.clear()  # deleted takes leave it too
            cache.update(fresh)
        return takes, bad

    def sweep(self, stale_after_s: float = STALE_AFTER_S) -> dict[str, list[str]]:  # noqa: C901
        """Finish what a killed import or recording left behind in takes/.

        An audio file whose JSON was never written becomes a take without a
        transcript (its bytes are kept; the Import page shows it for typing),
        or is removed when it holds no readable audio (an id reserved, never
        filled). A hidden temporary of an atomic write is removed. Only files
        older than `stale_after_s` are touched, and not an audio file with a
        fresh temporary beside it: a write in progress elsewhere is left alone.
        """
        done: dict[str, list[str]] = {"recovered": [], "removed": []}
        if not self.takes_dir.is_dir():
            return done
        now = _dt.datetime.now().timestamp()
        stems: set[str] = set()
        audio: list[os.DirEntry[str]] = []
        temps: list[os.DirEntry[str]] = []
        with os.scandir(self.takes_dir) as it:
            for entry in it:
                name = entry.name
                if name.startswith("."):
                    if _TEMP_RE.match(name):
                        temps.append(entry)
                elif name.endswith(".json"):
                    stems.add(name[:-5])
                elif TAKE_ID_RE.match(name.rsplit(".", 1)[0]):
                    audio.append(entry)
        busy: set[str] = set()
        for entry in temps:
            try:
                if now - entry.stat().st_mtime < stale_after_s:
                    busy.add(entry.name[1:].split(".", 1)[0])
                    continue
                os.unlink(entry.path)
                done["removed"].append(entry.name)
            except FileNotFoundError:
                continue
        for entry in audio:
            take_id = entry.name.rsplit(".", 1)[0]
            if take_id in stems or take_id in busy:
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if now - st.st_mtime < stale_after_s:
                continue
            path = Path(entry.path)
            try:
                info = probe(path)
            except AudioError as exc:
                if getattr(exc, "reason_code", "") in ("empty", "not_audio", "damaged"):
                    path.unlink(missing_ok=True)  # no audio in it: nothing to keep
                    done["removed"].append(entry.name)
                continue  # unreadable for now (permissions...): leave it for a later open
            take = Take(id=take_id, audio_path=path, meta_path=self.takes_dir / f"{take_id}.json",
                        origin="imported", source=None, created=now_iso(),
                        duration_s=round(info.duration_s, 4), sample_rate=info.sample_rate,
                        channels=info.channels, sha256=file_sha256(path), bytes=st.st_size,
                        extra={"recovered": "its metadata was never written"})
            write_json(take.meta_path, take.to_dict())
            done["recovered"].append(take_id)
        return done

    def find_take(self, take_id: str) -> Take:
        """A take by id, or by its unique numeric prefix ("7" or "0007")."""
        meta = self.takes_dir / f"{take_id}.json"
        if TAKE_ID_RE.match(take_id) and meta.is_file():
            # by its file name: no scan of every sidecar (a voice may hold thousands)
            take = Take.from_meta(meta)
            if take.id == take_id and take.audio_path.is_file():
                return take
        takes = self.list_takes()
        for t in takes:
            if t.id == take_id:
                return t
        if take_id.isdigit():
            matches = [t for t in takes
                       if (m := TAKE_ID_RE.match(t.id)) and int(m.group(1)) == int(take_id)]
            if len(matches) == 1:
                return matches[0]
        raise InputError(f"There is no take {take_id!r} in {self.path}.",
                         "List the takes with `voxshard-engine voice list VOICE`.")

    def set_take_text(self, take_id: str, text: str) -> Take:
        """Correct a transcript. Only the JSON changes; the audio stays untouched."""
        take = self.find_take(take_id)
        data = take.to_dict()
        data["text"] = tidy_text(text)
        write_json(take.meta_path, data)
        return Take.from_meta(take.meta_path)

    def set_take_excluded(self, take_id: str, excluded: bool = True) -> Take:
        """Leave a take out of prepare/training (or bring it back); audio untouched."""
        take = self.find_take(take_id)
        data = take.to_dict()
        data["extra"] = {**(data.get("extra") or {}), "excluded": bool(excluded)}
        write_json(take.meta_path, data)
        return Take.from_meta(take.meta_path)

    def delete_take(self, take_id: str) -> Take:
        take = self.find_take(take_id)
        # JSON first: once it is gone the take no longer exists, whatever happens next
        take.meta_path.unlink(missing_ok=True)
        take.audio_path.unlink(missing_ok=True)
        return take

    def summary(self, scanned: tuple[list[Take], list[dict[str, str]]] | None = None
                ) -> dict[str, Any]:
        """Totals and the verdict; `scanned` reuses a `scan()` the caller already made."""
        takes, problems = scanned if scanned is not None else self._scan()
        recorded_s = sum(t.duration_s or 0.0 for t in takes)
        out: dict[str, Any] = {
            "path": str(self.path), "speaker": self.speaker, "display_name": self.display_name,
            "language": self.language, "takes": len(takes),
            "recorded": sum(1 for t in takes if t.origin == "recorded"),
            "imported": sum(1 for t in takes if t.origin == "imported"),
            "without_text": sum(1 for t in takes if not t.text),
            "minutes_recorded": round(recorded_s / 60.0, 3),
            "recommended_minutes": float(self.prepare_settings["recommended_minutes"]),
            "problems": problems,
            "prepared": None,
        }
        report = self.prepared.report
        if report.is_file():
            try:
                rep = json.loads(report.read_text(encoding="utf-8"))
                totals = rep.get("totals", {})
                prepared_hashes = set(rep.get("take_hashes", []))
                out["prepared"] = {
                    "minutes_usable": totals.get("minutes_usable"),
                    "clips": totals.get("clips"), "usable_clips": totals.get("usable_clips"),
                    "rejected_takes": totals.get("rejected_takes"),
                    "created": rep.get("created"),
                    # stale when takes were added or removed since the last prepare
                    "stale": prepared_hashes != {t.sha256 for t in takes},
                }
            except (OSError, ValueError, AttributeError):
                out["prepared"] = {"damaged": True}
        out["verdict"] = _verdict(out)
        return out


def _verdict(s: dict[str, Any]) -> str:
    """One line a person reads first: is this voice ready to train?"""
    prep = s["prepared"]
    if not s["takes"]:
        return "No takes yet: record or import speech."
    if not prep or prep.get("damaged"):
        return "Not prepared yet: run prepare."
    if prep["stale"]:
        return "Takes changed since the last prepare: run prepare again."
    usable, rec = prep["minutes_usable"] or 0.0, s["recommended_minutes"]
    if usable >= rec:
        return f"Ready to train: {usable:.1f} min of usable speech."
    return f"Usable {usable:.1f} of {rec:g} recommended minutes: record more (training works " \
           "with less, but the voice will be less faithful)."


def _take_sort_key(t: Take) -> tuple[int, str]:
    m = TAKE_ID_RE.match(t.id)
    return (int(m.group(1)) if m else 1 << 30, t.id)


def _check_language(language: str) -> str:
    lang = language.strip().lower()
    if not re.fullmatch(r"[a-z][a-z_ -]{0,31}", lang):
        raise InputError(f"{language!r} is not a language name.",
                         "Use a name such as 'english', 'german' or 'auto'.")
    return lang


def create_voice(path: str | os.PathLike[str], speaker: str, language: str = "english",
                 prompt_set: str | None = None) -> Voice:
    """Make a new voice folder. The folder must not exist or be empty.

    The prompts to read are the set written in the voice's language, else English.
    """
    if prompt_set is None:
        prompt_set = prompt_set_for_language(language) or "english"
    root = voice_root(path)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        if is_voice_folder(root):
            raise WorkspaceError(f"{display_path(root)} is already a voice.",
                                 "Open it instead, or choose another folder.")
        raise WorkspaceError(f"{display_path(root)} exists and is not empty.",
                             "Choose a new folder for the voice.")
    config: dict[str, Any] = {
        "voice": {
            "format": FORMAT_VERSION, "speaker": safe_speaker_name(speaker),
            "display_name": speaker.strip(), "language": _check_language(language),
            "prompt_set": prompt_set, "created": now_iso(),
        },
        "prepare": dict(DEFAULT_PREPARE_SETTINGS),
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        for sub in ("takes", PREPARED, RUNS_DIR, EXPORTS_DIR, RENDERS_DIR):
            (root / sub).mkdir(exist_ok=True)
    except OSError as exc:
        raise WorkspaceError(f"Cannot create {display_path(root)}: {exc.strerror or exc}.",
                             "Choose a folder you can write to.") from exc
    voice = Voice(root, config)
    voice._save_config()  # last: the folder becomes a voice only when complete
    return voice


def voice_root(path: str | os.PathLike[str]) -> Path:
    """A voice folder as typed (`~`, relative to the current folder), made absolute.

    Absolute from here on: runs, Ray's storage and worker processes never see
    a relative path (see engine.core.storage).
    """
    try:
        return user_path(path)
    except (TypeError, ValueError) as exc:
        raise WorkspaceError("No voice folder was given.",
                             "Give the path of a voice folder.") from exc


def open_voice(path: str | os.PathLike[str]) -> Voice:
    root = voice_root(path)
    if not root.exists():
        raise WorkspaceError(f"There is no voice at {display_path(root)}.",
                             "Create one with `voxshard-engine voice new PATH --speaker NAME`.")
    if not root.is_dir():
        raise WorkspaceError(f"{display_path(root)} is a file, not a voice folder.")
    vf = root / VOICE_FILE
    if not vf.is_file():
        raise WorkspaceError(f"{display_path(root)} is not a voice folder (no {VOICE_FILE}).",
                             "Create one with `voxshard-engine voice new PATH --speaker NAME`.")
    try:
        config = tomllib.loads(vf.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise WorkspaceError(f"The voice file {display_path(vf)} is damaged ({exc}).",
                             "Fix or recreate voice.toml; the takes are safe.") from exc
    voice_table = config.get("voice")
    if not isinstance(voice_table, dict) or not isinstance(voice_table.get("speaker"), str):
        raise WorkspaceError(f"The voice file {display_path(vf)} has no [voice] speaker.",
                             "Fix or recreate voice.toml; the takes are safe.")
    if int(voice_table.get("format", 1)) > FORMAT_VERSION:
        raise WorkspaceError(f"{display_path(root)} was made by a newer Voxshard.",
                             "Update Voxshard to open it.")
    voice = Voice(root, config)
    try:
        voice.sweep()
    except (OSError, WorkspaceError):
        pass  # a read-only or damaged folder still opens; nothing was lost by not sweeping
    return voice


def is_voice_folder(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a voice folder: it holds a voice.toml (the last file a new voice
    gets, so a half-made one is not a voice)."""
    return (Path(path) / VOICE_FILE).is_file()


def list_voices(workspace: str | os.PathLike[str]) -> list[Path]:
    """Voice folders directly inside a workspace folder, by name."""
    root = voice_root(workspace)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if is_voice_folder(p))


def delete_voice(path: str | os.PathLike[str]) -> None:
    """Remove a voice folder and everything in it. Refuses folders that are not voices."""
    voice = open_voice(path)  # raises unless it really is a voice
    try:
        # voice.toml first: a half-deleted folder is then no longer taken for a voice
        voice.voice_file.unlink()
        shutil.rmtree(voice.path)
    except OSError as exc:
        raise WorkspaceError(f"Cannot delete {display_path(voice.path)}: "
                             f"{exc.strerror or exc}.") from exc
