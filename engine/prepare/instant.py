"""An instant voice: usable the moment the voice is prepared, with no training.

Its reference clip is the engine's (`engine.layout.manifest.reference_clip`: the one
training takes the speaker from), its words are that clip's transcript, and its speaker
vector is the base model's speaker encoder on that clip, when a base model is known
(given, or the one the voice trained from) and on this machine. Saved in the voice by
`engine.layout.tiers.write_instant`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from engine.audio.io import read_mono
from engine.audio.timebase import SAMPLE_RATE
from engine.core.errors import InputError, ModelError, WorkspaceError
from engine.layout.manifest import prepared_folder, read_manifest, reference_clip
from engine.layout.run import voice_base_model
from engine.layout.tiers import InstantVoice, write_instant
from engine.layout.voice import now_iso, open_voice
from engine.model.loading import resolve_model
from engine.model.speaker_encoder import load_speaker_encoder, x_vector


def speaker_vector(model_dir: str | os.PathLike[str], clip: os.PathLike[str]) -> np.ndarray:
    """The base model's x-vector of one clip (its speaker encoder only, on the CPU)."""
    encoder = load_speaker_encoder(model_dir, "cpu")
    return x_vector(encoder, read_mono(clip, SAMPLE_RATE))


def make_instant_voice(voice_dir: str | os.PathLike[str], base: str | None = None, *,
                       download: bool = False) -> InstantVoice:
    """Save the voice's instant voice from its prepared clips and return it.

    `base`: the model it speaks on (default: the one the voice trained from); fetched
    from the hub only with `download`. Without a base, or when the voice's own base is
    not on this machine, it is saved without a speaker vector (speech computes it from
    the clip); a `base` asked for that is not there raises.
    """
    voice = open_voice(voice_dir)
    rows = read_manifest(voice.path, usable_only=False, strict=False)
    clip = reference_clip(voice.path, rows)
    if clip is None:
        raise WorkspaceError(f"The voice {voice.display_name} has no usable prepared clip.",
                             "Prepare the voice first (voxshard-engine voice prepare VOICE).")
    folder = prepared_folder(voice.path)
    row = next(r for r in rows if r.get("path") and folder.row_file(r) == clip)
    text = str(row.get("text") or "").strip()
    if not text:
        raise InputError(f"The reference clip {clip.name} has no transcript.",
                         "Type its words on the Import page, then prepare again.")
    base_name = base or voice_base_model(voice.path)
    model_dir = None
    if base_name:
        try:
            model_dir = resolve_model(base_name, download=download)
        except ModelError:
            if base is not None:
                raise  # the base asked for is not there: say so
            # the voice's own base is not on this machine: the first speech computes it
    vec = speaker_vector(model_dir, clip) if model_dir is not None else None
    info: dict[str, Any] = {"clip_id": str(row["id"]), "text": text,
                            "speaker": voice.speaker, "base": base_name,
                            "created": now_iso()}
    return write_instant(voice.path, info, clip, vec)
