"""The Python API for scripts: the same engine as the CLI, driven from code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from engine import api
from engine.core.errors import ModelError, WorkspaceError
from engine.core.events import Event


def test_importing_the_api_loads_no_torch_or_ray() -> None:
    code = ("import sys, engine, engine.api; "
            "print([m for m in ('torch', 'ray', 'PySide6') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_script_flow_import_prepare_and_zero_shot_preview(
        tmp_path: Path, piper_sentences: list[dict], tiny_model_dir: Path) -> None:
    events: list[Event] = []
    voice = api.create_voice(tmp_path / "ada", speaker="Ada")
    first = api.next_prompt(voice)
    assert first is not None and first.text

    # a folder of WAVs with same-named .txt transcripts
    folder = piper_sentences[0]["path"].parent
    result = api.import_files(voice, [folder], on_event=events.append)
    assert len(result["imported"]) == len(piper_sentences)
    assert {t.text for t in voice.list_takes()} == {s["text"] for s in piper_sentences}
    report = api.prepare(voice, on_event=events.append)
    assert report["totals"]["usable_clips"] >= len(piper_sentences) - 1
    assert any(e.kind == "progress" for e in events)

    clip = next((voice.path / "prepared" / "clips").glob("*.wav"))
    out = tmp_path / "preview.wav"
    spoken = api.speak(tiny_model_dir, "A first preview of this voice.", out,
                       reference=clip, seed=3, max_frames=24)
    audio, sr = sf.read(out)
    assert sr == 24000 and audio.ndim == 1 and len(audio) > 0
    assert np.isfinite(audio).all()
    assert spoken["path"] == str(out)
    json.dumps(spoken)  # JSON-able, like the CLI's result


def test_api_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError):
        api.open_voice(tmp_path / "missing")
    with pytest.raises(ModelError):
        api.inspect_model(tmp_path)
