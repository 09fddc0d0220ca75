"""The Whisper backends' plumbing on a tiny random Whisper built offline.

Proves loading (local folder, hub id from the Hugging Face cache, "auto") and decoding
through transformers, and through faster-whisper after CTranslate2 conversion; not
accuracy (the weights are random, so are the words).
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.asr import recognizer as asr

pytestmark = pytest.mark.slow

HAS_CT2 = (importlib.util.find_spec("ctranslate2") is not None
           and importlib.util.find_spec("faster_whisper") is not None)


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.asr.tiny_whisper import make_tiny_whisper

    return make_tiny_whisper(tmp_path_factory.mktemp("asr") / "tiny-whisper")


@pytest.fixture(autouse=True)
def _fresh_recognizers() -> Any:
    asr._CACHE.clear()
    yield
    asr._CACHE.clear()


@pytest.fixture(scope="module")
def speech(piper_sentences: list[dict[str, Any]]) -> np.ndarray:
    return asr.load_audio(piper_sentences[0]["path"])


def _check(heard: asr.Transcript, backend: str, duration_s: float) -> None:
    assert heard.backend == backend and isinstance(heard.text, str)
    assert math.isclose(heard.duration_s, duration_s, rel_tol=1e-6)
    # speed is bench/bench_quality.py's figure (real-time factor per backend), not a test's
    for w in heard.words:
        assert 0 <= w.start_s <= w.end_s


def test_transformers_whisper_folder_loads_detects_language_and_decodes(
        tiny_whisper: Path, speech: np.ndarray) -> None:
    from engine.asr.tiny_whisper import LANGUAGES

    rec = asr.load_recognizer(str(tiny_whisper))
    assert rec.backend == "transformers" and rec.model == str(tiny_whisper)
    heard = rec.transcribe(speech)
    _check(heard, "transformers", len(speech) / asr.SAMPLE_RATE)
    assert heard.language in LANGUAGES  # detected (randomly, by a random model)
    assert heard.text and heard.words  # token timestamps through the alignment heads
    forced = rec.transcribe(speech, "german")
    assert forced.language == "de"
    # long audio goes through in 30-second windows
    long = rec.transcribe(np.tile(speech, 12))
    assert long.duration_s > 30


def test_hub_id_is_found_in_the_cache_and_auto_prefers_it(
        tiny_whisper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        speech: np.ndarray) -> None:
    import huggingface_hub.constants as hub

    cache = tmp_path / "hub"
    snap = cache / "models--tiny--whisper-test" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_whisper, snap)
    (cache / "models--tiny--whisper-test" / "refs").mkdir()
    (cache / "models--tiny--whisper-test" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    rec = asr.load_recognizer("tiny/whisper-test")
    assert rec.backend == "transformers" and rec.model == "tiny/whisper-test"
    monkeypatch.setattr(asr, "KNOWN_WHISPER_MODELS", ("tiny/not-here", "tiny/whisper-test"))
    monkeypatch.delenv(asr.ENV_VAR, raising=False)
    assert asr.describe("auto") == "tiny/whisper-test"
    assert asr.load_recognizer(None).model == "tiny/whisper-test"
    with pytest.raises(Exception, match="not on this machine"):
        asr.load_recognizer("tiny/not-here")


@pytest.mark.skipif(not HAS_CT2, reason="faster-whisper / ctranslate2 (optional extra) "
                    "are not installed")
def test_ctranslate2_folder_decodes_through_faster_whisper(
        tiny_whisper: Path, tmp_path: Path, speech: np.ndarray) -> None:
    from engine.asr.tiny_whisper import convert_to_ctranslate2

    folder = convert_to_ctranslate2(tiny_whisper, tmp_path / "tiny-whisper-ct2")
    assert (folder / "model.bin").is_file() and asr.model_kind(folder) == "faster-whisper"
    rec = asr.load_recognizer(str(folder), "cpu")
    assert rec.backend == "faster-whisper"
    heard = rec.transcribe(speech, "english")
    _check(heard, "faster-whisper", len(speech) / asr.SAMPLE_RATE)
    assert heard.language == "en"
