"""Audio signal processing only: file I/O, loudness, voice activity and slicing, clip checks.

The script-facing API, importable from here without loading anything heavy
until it is used (none of it ever imports torch):

    from engine.layout.voice import create_voice, open_voice
    from engine.audio import decode, read_mono
    from engine.prepare import import_files, prepare

    voice = create_voice("voices/ada", speaker="Ada")
    import_files(voice, ["recordings/"], transcripts="recordings/metadata.csv")
    report = prepare(voice, on_event=print)   # writes <voice>/prepared/...
"""

from __future__ import annotations

from engine.core.lazy import lazy_exports

_EXPORTS = {
    "decode": "engine.audio.io",
    "read_mono": "engine.audio.io",
    "probe": "engine.audio.io",
    "write_wav": "engine.audio.io",
    "TARGET_SR": "engine.audio.io",
    "integrated_loudness": "engine.audio.loudness",
    "normalize_loudness": "engine.audio.loudness",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
