"""CLI: what the workspace holds, read through engine.catalog (the window reads the same).

    voxshard-engine status [VOICE|WORKSPACE] [--json]
    voxshard-engine version [--json]
"""

from __future__ import annotations

import argparse
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from engine import __version__, catalog
from engine.cli.main import add_command
from engine.core.errors import InputError
from engine.core.events import Emitter
from engine.layout.voice import is_voice_folder


def _voice_lines(snap: catalog.VoiceSnapshot) -> list[str]:
    s = snap.summary
    lines = [f"Voice '{snap.speaker}' ({snap.language}) at {snap.path}",
             f"  takes      {s['takes']} ({s['minutes_recorded']:.2f} min recorded)"]
    prep = s.get("prepared")
    if prep and not prep.get("damaged"):
        lines.append(f"  usable     {prep.get('minutes_usable') or 0:.2f} min in "
                     f"{prep.get('usable_clips') or 0}/{prep.get('clips') or 0} clips")
    for run in snap.runs:
        steps = run.checkpoint_steps
        lines.append(f"  run        {run.name}: step {run.last_step or 0}/"
                     f"{run.total_steps or '?'}, checkpoints {steps or 'none'}")
    for export in snap.exports:
        lines.append(f"  export     {export.name}")
    lines.append(f"  renders    {len(snap.renders)}")
    lines.append(s["verdict"])
    return lines


def _status(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    path = Path(args.path)
    if is_voice_folder(path):
        snap = catalog.snapshot(path)
        return {"kind": "voice", "voice": snap.to_dict(),
                "summary": "\n".join(_voice_lines(snap))}
    if not path.is_dir():
        raise InputError(f"There is no folder at {path}.",
                         "Give a voice folder or the workspace folder that holds voices.")
    ws = catalog.workspace_status(path)
    lines = [f"{len(ws['voices'])} voice(s) in {path}"]
    for v in ws["voices"]:
        verdict = v.get("error") or v["summary"]["verdict"]
        lines.append(f"  {v['speaker']:<20} {Path(v['path']).name:<20} {verdict}")
    return {"kind": "workspace", **ws, "summary": "\n".join(lines)}


#: what the engine runs on; looked up in the engine's own environment, never imported
ENGINE_PACKAGES = ("torch", "ray", "transformers", "qwen-tts", "numpy", "soundfile")


def engine_versions() -> dict[str, str]:
    out = {"voxshard-engine": __version__, "python": platform.python_version()}
    for dist in ENGINE_PACKAGES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _version(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    versions = engine_versions()
    return {"versions": versions,
            "summary": "\n".join(f"{k:<16} {v}" for k, v in versions.items())}


def register(sub: Any) -> None:
    add_command(sub, "version", _version, "Show the engine's version and its packages'.")
    p = add_command(sub, "status", _status,
                    "Show what a voice (or every voice of a workspace) holds.")
    p.add_argument("path", nargs="?", default=".", metavar="VOICE|WORKSPACE",
                   help="a voice folder, or a workspace folder of voices (default: here)")
