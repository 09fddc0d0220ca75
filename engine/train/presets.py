"""Training's defaults by data volume and model size: the one home of these rules.

The driver resolves a run's config from them; the window's presets and the Record and
Prepare pages' words on how much audio a voice has ask the same functions, so the
window and the CLI train a voice the same way. Light: no torch (the window imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config.layers import Layer
from engine.core.errors import VoxshardError
from engine.model.loading import inspect_model, local_model_path

#: fewer usable clips than this cannot be split into train + validation batches
MIN_CLIPS = 4
#: less audio than this (seconds) cannot teach a voice anything
MIN_SECONDS = 10.0
#: below this many minutes the result is usually poor (facts: 10-30 min advised)
ADVISED_MINUTES = 10.0
#: from this many minutes on, a voice has plenty: fewer passes over bigger batches
LARGE_MINUTES = 30.0
#: the talker's hidden size of the published base models (qwen3-tts-facts.md), for a
#: hub id not downloaded yet
KNOWN_TALKER_HIDDEN = {"Qwen/Qwen3-TTS-12Hz-1.7B-Base": 2048,
                       "Qwen/Qwen3-TTS-12Hz-0.6B-Base": 1024}


@dataclass(frozen=True)
class Volume:
    """A band of usable audio, as the presets split it."""

    name: str
    #: the band holds voices with fewer minutes than this
    below_minutes: float
    note: str
    #: its name on the command line (`train --preset`)
    key: str


VOLUMES = (
    Volume(f"Few minutes (under {ADVISED_MINUTES:g} min)", ADVISED_MINUTES,
           "more passes over small batches, frequent checkpoints", "few"),
    Volume(f"Standard ({ADVISED_MINUTES:g}–{LARGE_MINUTES:g} min)", LARGE_MINUTES,
           "the usual fine-tune", "standard"),
    Volume(f"Large (over {LARGE_MINUTES:g} min)", float("inf"),
           "fewer passes over bigger batches", "large"),
)
#: the bands by their command-line names
VOLUME_KEYS = tuple(v.key for v in VOLUMES)


def volume_index(minutes: float | None) -> int:
    """The band of `VOLUMES` a voice with `minutes` of usable audio falls in (None: the
    first)."""
    if minutes is None:
        return 0
    return next(i for i, v in enumerate(VOLUMES) if minutes < v.below_minutes)


def optim_preset(talker_hidden: int) -> dict[str, Any]:
    """The learning rate and warmup for a model size.

    2e-6 is the community's advice for 1.7B (2e-5, the upstream default, often yields
    noise or no end-of-speech); the 0.6B model tolerates a bit more; the tiny test model
    needs a real step size to show learning at all.
    """
    if talker_hidden >= 2048:
        return {"lr": 2e-6, "warmup_steps": 20}
    if talker_hidden >= 1024:
        return {"lr": 4e-6, "warmup_steps": 20}
    return {"lr": 1e-3, "warmup_steps": 2}


def talker_hidden_of(base: str) -> int | None:
    """The talker's hidden size of a base model named by a user (a folder: read from its
    config; a published hub id: known), or None when it cannot be told without a
    download."""
    path = local_model_path(base)
    if path is None:
        return KNOWN_TALKER_HIDDEN.get(base.strip())
    try:
        return inspect_model(path).talker_hidden
    except VoxshardError:
        return None


def base_talker_hidden(base: str) -> int:
    """`talker_hidden_of` a base model named by a user, the 1.7B's when its size is not
    known before a download (the lowest learning rate of the published models)."""
    return talker_hidden_of(base) or KNOWN_TALKER_HIDDEN["Qwen/Qwen3-TTS-12Hz-1.7B-Base"]


def base_optim_preset(base: str) -> dict[str, Any]:
    """`optim_preset` for a base model named by a user (`base_talker_hidden`)."""
    return optim_preset(base_talker_hidden(base))


def preset(minutes: float, talker_hidden: int, band: str | None = None
           ) -> dict[str, dict[str, Any]]:
    """Defaults by data volume and model size (then the caller's overrides win); `band`
    (a key of `VOLUME_KEYS`) picks a band of `VOLUMES` whatever the minutes.

    Little data: more passes, smaller batches, frequent checkpoints; lots of data: fewer
    passes over bigger batches. The learning rate follows model size (`optim_preset`).
    """
    return band_preset(volume_index(minutes) if band is None else VOLUME_KEYS.index(band),
                       talker_hidden)


def band_preset(band: int, talker_hidden: int) -> dict[str, dict[str, Any]]:
    """The defaults of the `band`-th band of `VOLUMES` for a model size (`preset`)."""
    run = ({"epochs": 20.0, "checkpoint_every": 50, "val_every": 25},
           {"epochs": 10.0, "checkpoint_every": 100, "val_every": 50},
           {"epochs": 5.0, "checkpoint_every": 200, "val_every": 100})[band]
    return {"run": run, "data": {"batch_size": (4, 8, 16)[band]},
            "optim": optim_preset(talker_hidden)}


def size_words(talker_hidden: int) -> str:
    """A model size as `optim_preset` tells them apart: "1.7B", "0.6B", "a model under 0.6B"."""
    return "1.7B" if talker_hidden >= 2048 else "0.6B" if talker_hidden >= 1024 else \
        "a model under 0.6B"


def preset_layers(minutes: float, talker_hidden: int, band: str | None = None
                  ) -> list[Layer]:
    """`preset` as the layers of a merge (`engine.config.layers`), each value's source in
    words: the band's length, cadence and batch ("the preset for standard (10–30 min)"),
    the model size's learning rate ("the preset for 0.6B")."""
    index = volume_index(minutes) if band is None else VOLUME_KEYS.index(band)
    values = band_preset(index, talker_hidden)
    by_band = {f"{s}.{k}": v for s in ("run", "data") for k, v in values[s].items()}
    by_size = {f"optim.{k}": v for k, v in values["optim"].items()}
    return [Layer(f"the preset for {VOLUMES[index].name[0].lower()}{VOLUMES[index].name[1:]}",
                  by_band),
            Layer(f"the preset for {size_words(talker_hidden)}", by_size)]


def preset_band_of(config: dict[str, Any], talker_hidden: int) -> int | None:
    """The band of `VOLUMES` whose preset a run's saved config trained by (its length by
    epochs, checkpoint and validation cadence, and learning rate), or None: its own
    settings."""
    run, optim = config.get("run") or {}, config.get("optim") or {}
    if not isinstance(run, dict) or not isinstance(optim, dict) or run.get("steps"):
        return None
    for band in range(len(VOLUMES)):
        values = band_preset(band, talker_hidden)
        if all(run.get(k) == v for k, v in values["run"].items()) and \
                optim.get("lr") == values["optim"]["lr"]:
            return band
    return None
