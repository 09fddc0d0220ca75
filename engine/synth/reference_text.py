"""The words of a reference clip nobody wrote down, heard by the recogniser.

In-context cloning continues a reference clip and needs what it says. A zero-shot voice
resolved without a transcript (`VoiceSource.extra["transcribe"]`) gets one here, from a
Whisper model in the local cache or the one VOXSHARD_ASR names; with none, or when it
hears nothing, the voice clones from the clip's speaker vector alone.
"""

from __future__ import annotations

import dataclasses
import os

from engine.asr.recognizer import ENV_VAR, find_whisper, transcribe_file
from engine.core.errors import VoxshardError
from engine.core.events import Emitter
from engine.synth.voice import VoiceSource


def transcribed(source: VoiceSource, emitter: Emitter) -> VoiceSource:
    """`source` with its reference clip's transcript from the recogniser; unchanged, with
    the reason logged, when there is none or it hears nothing."""
    extra = {k: v for k, v in source.extra.items() if k != "transcribe"}
    spec = os.environ.get(ENV_VAR) or find_whisper()
    if spec:
        assert source.reference is not None
        try:
            heard = transcribe_file(source.reference, spec).text.strip()
        except VoxshardError as exc:
            emitter.log(f"The reference clip could not be transcribed: {exc.message}",
                        level="warning")
            heard = ""
        if heard:
            emitter.log(f"Transcribed the reference clip ({spec}): {heard!r}; give "
                        "--reference-text if that is not what it says.", level="info")
            extra.pop("note", None)
            return dataclasses.replace(source, reference_text=heard, extra=extra)
    if extra.get("note"):
        emitter.log(str(extra.pop("note")), level="warning")
    return dataclasses.replace(source, extra=extra)
