"""Prepare: takes in, training clips out (import, target speaker, slicing, transcripts, report).

Above `audio` (signal processing) and `asr` (recognisers); below `data`. Nothing
heavy is imported at package import:

    from engine.prepare import import_files, prepare
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "import_files": "engine.prepare.importer",
    "load_transcripts": "engine.prepare.transcripts",
    "prepare": "engine.prepare.pipeline",
    "transcribe_takes": "engine.prepare.transcribe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine.prepare' has no attribute {name!r}")
