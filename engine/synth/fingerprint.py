"""What makes a voice's sound, as fingerprints of content (never of paths or names).

A voice's name stays while what it speaks with changes: `ada` is its instant voice until
it is trained, then its adapter or export. `sound_fingerprint` names the model behind a
resolved voice: its base model's weights, its tier, and its own part (the export's
files, the run's checkpoint, the adapter voice's files, the instant voice's clip and
speaker vector). Two sources that sound alike have the same fingerprint; a retrained
checkpoint, a new adapter or a re-made instant voice gives another. Light: no torch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.core.errors import VoxshardError
from engine.core.kinds import VoiceKind
from engine.layout.tiers import instant_dir
from engine.model.adapter import weights_fingerprint
from engine.model.files import memo_per_version
from engine.synth.voice import VoiceSource

#: a file up to this size is read whole; a larger one by its size and samples
_WHOLE_BYTES = 1 << 20
_SAMPLES, _SAMPLE_BYTES = 64, 4096


def _file_fingerprint(path: Path) -> str:
    def compute() -> str:
        h = hashlib.sha256()
        size = path.stat().st_size
        h.update(size.to_bytes(8, "little"))
        with open(path, "rb") as fh:
            if size <= _WHOLE_BYTES:
                h.update(fh.read())
            else:
                for i in range(_SAMPLES):
                    fh.seek(i * (size - _SAMPLE_BYTES) // (_SAMPLES - 1))
                    h.update(fh.read(_SAMPLE_BYTES))
        return h.hexdigest()
    return memo_per_version(path, compute, "content")


def content_fingerprint(path: Path) -> str:
    """A file's or folder's content: each file's place in it and its bytes (a large file
    by its size and 64 samples, so gigabytes cost milliseconds)."""
    h = hashlib.sha256(b"content-v1")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        h.update(file.relative_to(path).as_posix().encode() if file != path else b".")
        h.update(_file_fingerprint(file).encode())
    return h.hexdigest()


def _own_part(source: VoiceSource) -> Path | None:
    """The files that make this voice more than its base model."""
    if source.kind == VoiceKind.CHECKPOINT:
        return source.checkpoint
    if source.kind == VoiceKind.ADAPTER:
        return Path(source.extra["adapter"])
    if source.kind == VoiceKind.ZERO_SHOT:
        if source.voice_dir is not None and instant_dir(source.voice_dir).is_dir():
            return instant_dir(source.voice_dir)
        return source.reference
    return None  # a full export: its model folder is all of it


def sound_fingerprint(source: VoiceSource) -> str:
    """A short digest of what makes `source`'s sound (see the module doc)."""
    h = hashlib.sha256(b"sound-v1")
    h.update(source.kind.encode())
    try:
        model = weights_fingerprint(source.model_dir)
    except (VoxshardError, OSError):  # a model folder in another layout: all its files
        model = content_fingerprint(source.model_dir)
    h.update(model.encode())
    own = _own_part(source)
    if own is not None:
        h.update(content_fingerprint(own).encode())
    for value in (source.speaker, source.reference_text, source.lora_scaling):
        h.update(repr(value).encode())
    return h.hexdigest()[:16]
