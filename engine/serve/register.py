"""`POST /v1/audio/voices`: a client registers an instant voice into the workspace.

OpenAI's voice-creation shape, as multipart form data: `name`, `audio_sample` (the
clip, 3-30 s), `consent`; plus `ref_text`, the clip's words (as vLLM-Omni takes them),
for in-context cloning. The server makes a voice folder `<workspace>/<name>` holding
the clip as a take and its instant voice (`engine.layout.tiers`) on the server's
reference base, marked as made by the server: `DELETE /v1/audio/voices/{name}` removes
only such voices, never one a person made. The name is checked (letters, digits, `-`,
`_`), so a client never names a path. Light: no torch.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.audio.resample import resample
from engine.audio.timebase import SAMPLE_RATE
from engine.core.atomic import read_json
from engine.core.errors import VoxshardError
from engine.core.kinds import ServedKind, Tier
from engine.layout.tiers import INSTANT_INFO, instant_dir, write_instant
from engine.layout.voice import create_voice, delete_voice, now_iso
from engine.serve.request import ApiError
from engine.serve.voices import ServedVoice

#: a registered clip: long enough to carry a voice, short enough to stay cheap
SAMPLE_SECONDS = (3.0, 30.0)
MADE_BY = "serve"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class VoiceForm:
    name: str
    audio: bytes
    consent: str
    ref_text: str | None


def parse_voice_form(body: bytes, content_type: str) -> VoiceForm:
    """The multipart form of a voice creation, or a 400 saying which field is wrong."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(400, "Send the voice as multipart form data (name, audio_sample, "
                       "consent, ref_text).", code="invalid_request")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            fields[name] = part.get_payload(decode=True) or b""
    for need in ("name", "audio_sample", "consent"):
        if not fields.get(need):
            raise ApiError(400, f"The voice has no {need}.", param=need, code="missing_field")
    name = fields["name"].decode("utf-8", "replace").strip()
    if not _NAME.match(name):
        raise ApiError(400, f"The voice name {name[:80]!r} is not one this server takes; use "
                       "letters, digits, '-' and '_' (64 at most).", param="name",
                       code="invalid_value")
    text = fields.get("ref_text", b"").decode("utf-8", "replace").strip() or None
    return VoiceForm(name, fields["audio_sample"], fields["consent"].decode("utf-8", "replace"),
                     text)


def read_clip(data: bytes, param: str, seconds: tuple[float, float], unreadable: str,
              label: str) -> tuple[np.ndarray, int]:
    """A client's clip as mono float32 and its rate, or a 400: `unreadable` when it is not
    audio, else `label` is N s long when outside `seconds` (a registered voice's sample
    here, a request's reference clip in engine.serve.app)."""
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception:  # libsndfile's own error types: the bytes are not audio it reads
        raise ApiError(400, unreadable, param=param, code="invalid_value") from None
    length = len(audio) / rate if rate else 0.0
    low, high = seconds
    if not low <= length <= high:
        raise ApiError(400, f"{label} is {length:.1f} s long; send {low:g} to {high:g} s of "
                       "the speaker (5-15 s works well).", param=param, code="invalid_value")
    return audio.mean(axis=1), int(rate)


def voice_object(name: str, created: float) -> dict[str, Any]:
    """OpenAI's Voice object."""
    return {"id": name, "object": "audio.voice", "name": name, "type": "audio_sample",
            "created_at": int(created)}


def register_instant(workspace: Path, base: str, form: VoiceForm) -> ServedVoice:
    """Make the voice folder and its instant voice; a taken name is a 409."""
    folder = workspace / form.name
    if folder.exists():
        raise ApiError(409, f"There is already a voice named {form.name!r}.", param="name",
                       code="voice_exists")
    audio, rate = read_clip(form.audio, "audio_sample", SAMPLE_SECONDS,
                            "audio_sample is not audio this server can read; send a WAV, "
                            "FLAC, OGG or MP3 file.", "The audio sample")
    try:
        voice = create_voice(folder, form.name)
        take = voice.add_take(audio, form.ref_text or "", sample_rate=rate,
                              extra={"consent": form.consent, "made_by": MADE_BY})
        with tempfile.TemporaryDirectory() as tmp:
            clip = Path(tmp) / "clip.wav"
            sf.write(clip, resample(audio, rate, SAMPLE_RATE), SAMPLE_RATE, subtype="PCM_16")
            write_instant(voice.path, {"clip_id": take.id, "text": form.ref_text or "",
                                       "speaker": voice.speaker, "base": base,
                                       "made_by": MADE_BY, "created": now_iso()}, clip, None)
    except VoxshardError as exc:
        raise ApiError(400, exc.message, code="invalid_value") from exc
    return ServedVoice(form.name, voice.path, ServedKind.VOICE, voice.language, Tier.INSTANT,
                       base)


def remove_registered(workspace: Path, name: str) -> None:
    """Delete a voice this server registered; any other is refused (403) or unknown (404)."""
    folder = workspace / name
    if not _NAME.match(name) or not (folder / "voice.toml").is_file():
        raise ApiError(404, f"There is no voice named {name[:80]!r}.", param="voice",
                       code="voice_not_found")
    info = read_json(instant_dir(folder) / INSTANT_INFO)
    if not isinstance(info, dict) or info.get("made_by") != MADE_BY:
        raise ApiError(403, f"The voice {name!r} was not made by this server, so it is not "
                       "removed here.", param="voice", code="voice_not_removable")
    delete_voice(folder)


def created_at(folder: Path) -> float:
    try:
        return folder.stat().st_mtime
    except OSError:
        return time.time()
