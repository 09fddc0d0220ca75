"""The voices a server offers, each under a stable name.

Names come from folder names, so they stay the same across restarts:

- a voice folder `ada` (given, or inside `--workspace`): `ada` speaks with what
  `speak ada` would use (its latest export, else its latest run's checkpoint);
- each export of it: `ada/<export folder>`; each run with a checkpoint: `ada/<run>`;
- an export or run folder given on its own: its folder name.

Clients only ever send a name; the server maps it to a folder it found itself,
so no client-supplied path is ever opened. Light: no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import catalog
from engine.core.errors import InputError
from engine.layout.exports import EXPORTS_DIR, exports_dir
from engine.layout.run import Run, runs_dir


@dataclass(frozen=True)
class ServedVoice:
    name: str
    #: what the warm worker loads (a voice, export or run folder)
    target: Path
    kind: str  # "voice", "export" or "run"
    language: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.name, "name": self.name, "object": "voice", "kind": self.kind,
                "language": self.language or "auto"}


def _language(voice_dir: Path | None) -> str:
    if voice_dir is None:
        return ""
    entry = next((v for v in catalog.list_voices(voice_dir.parent) if v.path == voice_dir), None)
    return entry.language if entry else ""


def _is_export(path: Path) -> bool:
    return (path / "config.json").is_file()


def _is_run(path: Path) -> bool:
    run = Run(path)
    return run.config_file.is_file() and run.voice_dir is not None and bool(run.checkpoints())


def _of_voice(voice_dir: Path) -> list[ServedVoice]:
    """The voice itself (when it has something to speak with), its exports and its runs."""
    language = _language(voice_dir)
    exports = catalog.list_exports(voice_dir)
    runs = [r for r in catalog.list_runs(voice_dir) if r.checkpoints]
    out: list[ServedVoice] = []
    if exports or runs:
        out.append(ServedVoice(voice_dir.name, voice_dir, "voice", language))
    out += [ServedVoice(f"{voice_dir.name}/{e.name}", e.path, "export", language)
            for e in exports]
    out += [ServedVoice(f"{voice_dir.name}/{r.name}", r.path, "run", language) for r in runs]
    return out


def discover(targets: list[str | os.PathLike[str]],
             workspace: str | os.PathLike[str] | None = None) -> dict[str, ServedVoice]:
    """Every voice to serve, by name; a bad target or an empty result says what to do."""
    found: list[ServedVoice] = []
    for raw in targets:
        path = Path(raw).expanduser().absolute()
        if not path.is_dir():
            raise InputError(f"{path} is not a folder.",
                             "Give exported voices, voice folders or run folders.")
        if (path / "voice.toml").is_file() or exports_dir(path).is_dir() \
                or runs_dir(path).is_dir():
            mine = _of_voice(path)
            if not mine:
                raise InputError(f"The voice {path.name} has no export or trained run yet.",
                                 "Train and export it first.")
            found += mine
        elif _is_run(path):
            found.append(ServedVoice(path.name, path, "run", _language(Run(path).voice_dir)))
        elif _is_export(path):
            voice = path.parent.parent if path.parent.name == EXPORTS_DIR else None
            found.append(ServedVoice(path.name, path, "export", _language(voice)))
        else:
            raise InputError(f"{path} is not an exported voice, a voice folder or a run.",
                             "Give the folder that holds config.json, or a voice folder.")
    if workspace is not None:
        for entry in catalog.list_voices(Path(workspace).expanduser()):
            found += _of_voice(entry.path.absolute())
    voices: dict[str, ServedVoice] = {}
    for v in found:
        voices.setdefault(v.name, v)  # the same folder given twice is served once
    if not voices:
        raise InputError("There is no voice to serve.",
                         "Give an exported voice, a voice folder, or --workspace DIR.")
    return voices
