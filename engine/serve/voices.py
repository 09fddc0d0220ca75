"""The voices a server offers, each under a stable name.

Names come from folder names, so they stay the same across restarts:

- a voice folder `ada` (given, or inside `--workspace`): `ada` speaks with what
  `speak ada` would use (its latest export, else its latest run's checkpoint);
- each export of it: `ada/<export folder>`; each run with a checkpoint: `ada/<run>`;
- an export or run folder given on its own: its folder name;
- each tier of a voice (`engine.layout.tiers`): its adapter voices `ada/<adapter folder>`
  and its instant voice `ada/instant` (only when its base is known: recorded, or the one
  its runs trained from; it cannot speak without one); each served voice says its tier
  and its base.

Clients only ever send a name; the server maps it to a folder it found itself,
so no client-supplied path is ever opened. Light: no torch.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import catalog
from engine.core.errors import InputError, VoxshardError
from engine.core.kinds import TIER_PREFERENCE, ServedKind, Tier
from engine.layout.exports import EXPORTS_DIR, exports_dir, is_model_folder
from engine.layout.run import Run, runs_dir
from engine.layout.tiers import is_adapter, read_adapter_info
from engine.model.loading import DEFAULT_BASE_MODEL, download_model
from engine.synth.voice import resolve_source, trained_styles


@dataclass(frozen=True)
class ServedVoice:
    name: str
    #: what the warm worker loads (a voice, export or run folder)
    target: Path
    kind: ServedKind
    language: str
    #: what it speaks with (`engine.layout.tiers`); None for a run's checkpoint
    tier: Tier | None = None
    #: the base model it speaks on (an adapter or instant voice) or was made from
    base: str | None = None

    def to_dict(self, styles: list[str] | None = None) -> dict[str, Any]:
        """Its listing; `styles` as a server keeps them (`engine.serve.watch`), else read
        from disk now."""
        return {"id": self.name, "name": self.name, "object": "voice", "kind": self.kind,
                "language": self.language or "auto", "tier": self.tier, "base": self.base,
                "styles": self.styles if styles is None else styles}

    def load_options(self) -> dict[str, Any]:
        """What a load of this voice names besides its folder: an instant voice's base
        (its own, or the one it is served on: `speaking_tiers`)."""
        return {"base": self.base} if self.tier == Tier.INSTANT and self.base else {}

    def source(self) -> Any:
        """What it speaks with (`engine.synth.voice.resolve_source`), on the base it is
        served on: the one resolution the server, its workers and Read share."""
        return resolve_source(str(self.target), **self.load_options())

    @property
    def styles(self) -> list[str]:
        """The style descriptions what it speaks with was trained on ([] for none)."""
        try:
            return trained_styles(self.source())
        except VoxshardError:
            return []


def _language(voice_dir: Path | None) -> str:
    if voice_dir is None:
        return ""
    entry = next((v for v in catalog.list_voices(voice_dir.parent) if v.path == voice_dir), None)
    return entry.language if entry else ""


def _is_run(path: Path) -> bool:
    run = Run(path)
    return run.config_file.is_file() and run.voice_dir is not None and bool(run.checkpoints())


@functools.cache
def _local_default_base() -> str | None:
    # looked up once: the hub's cache is read, and the base is rarely fetched meanwhile
    try:
        download_model(DEFAULT_BASE_MODEL, download=False)
    except VoxshardError:
        return None
    return DEFAULT_BASE_MODEL


def serving_base(reference_base: str | None = None) -> str | None:
    """What a served instant voice that knows no base of its own speaks on: the server's
    --reference-base, else the default base model when it is on this computer (what the
    Listen page's Base field offers first); None: such a voice cannot speak."""
    return reference_base or _local_default_base()


def servable(voice_dir: Path, base: str | None = None) -> bool:
    """Whether a voice folder has anything to speak with (`speaking_tiers`, or a trained
    run): the one rule of what a server, the Serve page and Read offer."""
    return bool(_of_voice(voice_dir, base))


def speaking_tiers(voice_dir: Path, base: str | None = None) -> list[dict[str, Any]]:
    """What a voice can speak with now (`catalog.list_tiers`): an instant voice speaks on
    its own base (recorded, or its runs'), else on `base`, the one the app speaks it on
    (the Listen page's Base field; a server's --reference-base or the default base model
    on this machine); with neither it cannot speak, and is left out."""
    tiers = [dict(t, base=t["base"] or base) if t["tier"] == Tier.INSTANT else t
             for t in catalog.list_tiers(voice_dir)]
    return [t for t in tiers if t["tier"] != Tier.INSTANT or t["base"]]


def _of_voice(voice_dir: Path, base: str | None = None) -> list[ServedVoice]:
    """The voice itself (when it has something to speak with), its exports, its adapter
    and instant voices, and its runs."""
    language = _language(voice_dir)
    tiers = speaking_tiers(voice_dir, base)
    runs = [r for r in catalog.list_runs(voice_dir) if r.checkpoints]
    out: list[ServedVoice] = []
    if tiers or runs:
        # what `speak VOICE` takes: a full export, else an adapter, else the run, else instant
        of = {tier: [t for t in tiers if t["tier"] == tier] for tier in Tier}
        spoken = of[Tier.FULL] or of[Tier.ADAPTER] or ([] if runs else of[Tier.INSTANT])
        top = spoken[0] if spoken else {"tier": None, "base": None}
        out.append(ServedVoice(voice_dir.name, voice_dir, ServedKind.VOICE, language,
                               top["tier"], top["base"]))
    for t in sorted(tiers, key=lambda t: TIER_PREFERENCE.index(t["tier"])):
        tier = Tier(t["tier"])
        out.append(ServedVoice(f"{voice_dir.name}/{t['name']}", Path(t["path"]),
                               ServedKind.of_tier(tier), language, tier, t["base"]))
    out += [ServedVoice(f"{voice_dir.name}/{r.name}", r.path, ServedKind.RUN, language)
            for r in runs]
    return out


def served_stamp(targets: list[str | os.PathLike[str]],
                 workspace: str | os.PathLike[str] | None = None) -> tuple[Any, ...]:
    """Cheap proof that what `discover` finds has changed: the workspace folder's time and
    each folder's `catalog.change_signature` (a voice made or removed, an export or a
    checkpoint written, its voice.toml edited); a few stats, no voice read."""
    roots = [Path(t).expanduser().absolute() for t in targets]
    parts: list[Any] = []
    if workspace is not None:
        folder = Path(workspace).expanduser()
        try:
            parts.append(("", folder.stat().st_mtime_ns, 0))
            roots += sorted(Path(e.path) for e in os.scandir(folder) if e.is_dir())
        except OSError:
            parts.append(("", 0, -1))
    for root in roots:
        parts += [(f"{root}/{key}", mtime, size)
                  for key, mtime, size in catalog.change_signature(root)]
    return tuple(parts)


def discover(targets: list[str | os.PathLike[str]],
             workspace: str | os.PathLike[str] | None = None,
             registers: bool = False, base: str | None = None) -> dict[str, ServedVoice]:
    """Every voice to serve, by name; a bad target or an empty result says what to do.
    `registers`: clients may register voices into `workspace` (`--reference-base`), so
    an empty workspace is a server waiting for its first voice, not a mistake. `base`:
    what an instant voice that knows no base of its own speaks on (`speaking_tiers`)."""
    found: list[ServedVoice] = []
    for raw in targets:
        path = Path(raw).expanduser().absolute()
        if not path.is_dir():
            raise InputError(f"{path} is not a folder.",
                             "Give exported voices, voice folders or run folders.")
        if (path / "voice.toml").is_file() or exports_dir(path).is_dir() \
                or runs_dir(path).is_dir():
            mine = _of_voice(path, base)
            if not mine and any(t["tier"] == Tier.INSTANT for t in catalog.list_tiers(path)):
                raise InputError(f"The instant voice of {path.name} does not know its base "
                                 "model yet, so it cannot speak.",
                                 "Give it one (voxshard-engine voice instant VOICE --base "
                                 "MODEL), or train the voice.")
            if not mine:
                raise InputError(f"The voice {path.name} has no export, trained run or "
                                 "instant voice yet.", "Prepare it (that makes its instant "
                                 "voice), or train and export it.")
            found += mine
        elif _is_run(path):
            found.append(ServedVoice(path.name, path, ServedKind.RUN,
                                     _language(Run(path).voice_dir)))
        elif is_model_folder(path):
            voice = path.parent.parent if path.parent.name == EXPORTS_DIR else None
            found.append(ServedVoice(path.name, path, ServedKind.EXPORT, _language(voice),
                                     Tier.FULL))
        elif is_adapter(path):
            voice = path.parent.parent if path.parent.name == EXPORTS_DIR else None
            found.append(ServedVoice(path.name, path, ServedKind.ADAPTER, _language(voice),
                                     Tier.ADAPTER, read_adapter_info(path).get("base")))
        else:
            raise InputError(f"{path} is not an exported voice, a voice folder or a run.",
                             "Give the folder that holds config.json, or a voice folder.")
    if workspace is not None:
        for entry in catalog.list_voices(Path(workspace).expanduser()):
            found += _of_voice(entry.path.absolute(), base)
    voices: dict[str, ServedVoice] = {}
    for v in found:
        voices.setdefault(v.name, v)  # the same folder given twice is served once
    if not voices and not (registers and workspace is not None):
        if workspace is not None:
            raise InputError(f"There is no voice in {workspace} yet, so there is nothing to "
                             "serve.", "Give {serve.reference_base} a Base model so that "
                             "clients can register voices into it (POST /v1/audio/voices), "
                             "or prepare or train a voice there first.")
        raise InputError("There is no voice to serve.",
                         "Give an exported voice, a voice folder, or {serve.workspace}.")
    return voices
