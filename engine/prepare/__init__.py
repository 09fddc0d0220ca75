"""Prepare: takes in, training clips out (import, target speaker, slicing, transcripts, report).

Above `audio` (signal processing) and `asr` (recognisers); below `data`. Nothing
heavy is imported at package import:

    from engine.prepare import import_files, prepare
"""

from __future__ import annotations

from engine.core.lazy import lazy_exports

_EXPORTS = {
    "import_files": "engine.prepare.importer",
    "load_transcripts": "engine.prepare.transcripts",
    "prepare": "engine.prepare.pipeline",
    "transcribe_takes": "engine.prepare.transcribe",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
