"""Speech recognition on real speech (the piper voice), WER normalisation, clear failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.asr.wer import wer, word_errors
from engine.core.errors import AudioError, InputError, ModelError
from engine.text import number_words, wer_words


def test_wer_normalises_case_punctuation_numbers_and_recogniser_markers() -> None:
    assert wer_words("Dr. Smith paid $12, didn't he?") == \
        ["dr", "smith", "paid", "twelve", "didn't", "he"]
    assert wer_words("to(3) <sil> THE [NOISE] 1,250") == \
        ["to", "the", "one", "thousand", "two", "hundred", "fifty"]
    assert number_words(0) == "zero" and number_words(101) == "one hundred one"
    assert wer("The kettle started to whistle.", "the kettle started to whistle") == 0.0
    e = word_errors("he tuned the violin and played a slow melody",
                    "the tune the violin and played the slow mo d")
    assert (e.substitutions, e.deletions, e.insertions) == (4, 0, 1)
    assert wer("", "") == 0.0 and wer("", "noise") == 1.0 and wer("a b", "") == 1.0


def test_pocketsphinx_transcribes_piper_speech(piper_sentences: list[dict[str, Any]]) -> None:
    from engine.asr.recognizer import load_recognizer, transcribe_file

    rec = load_recognizer("pocketsphinx")
    assert rec.backend == "pocketsphinx"
    rates = []
    for s in piper_sentences[:4]:
        heard = transcribe_file(s["path"], "pocketsphinx", "english")
        rates.append(wer(s["text"], heard.text))
        assert heard.language == "en" and heard.rtf > 0
        # word times: in order, inside the clip
        starts = [w.start_s for w in heard.words]
        assert starts == sorted(starts) and heard.words
        assert all(0 <= w.start_s < w.end_s <= heard.duration_s + 0.05 for w in heard.words)
    # low accuracy by design (about 0.2 on this voice), but far from a wrong sentence
    assert float(np.mean(rates)) < 0.45, rates


def test_missing_whisper_model_says_how_to_get_it() -> None:
    from engine.asr.recognizer import load_recognizer

    with pytest.raises(ModelError) as info:
        load_recognizer("Systran/faster-whisper-nowhere")
    assert str(info.value).count(".") >= 1
    assert "not on this machine" in info.value.message
    assert "hf download Systran/faster-whisper-nowhere" in (info.value.hint or "")


def test_bad_specs_and_folders_fail_clearly(tmp_path: Path) -> None:
    from engine.asr.recognizer import load_recognizer

    with pytest.raises(InputError, match="not a speech recognizer"):
        load_recognizer("what is this")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelError, match="not a Whisper model"):
        load_recognizer(str(tmp_path))
    with pytest.raises(ModelError, match="not a folder"):
        load_recognizer(str(tmp_path / "config.json"))


def test_unreadable_clip_and_wrong_language_fail_clearly(tmp_path: Path,
                                                         piper_sentences: list[dict[str, Any]]
                                                         ) -> None:
    from engine.asr.recognizer import transcribe_file

    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    with pytest.raises(AudioError, match=r"broken\.wav") as info:
        transcribe_file(bad, "pocketsphinx")
    assert "WAV" in (info.value.hint or "")
    with pytest.raises(AudioError, match=r"missing\.wav"):
        transcribe_file(tmp_path / "missing.wav", "pocketsphinx")
    with pytest.raises(InputError, match="English only"):
        transcribe_file(piper_sentences[0]["path"], "pocketsphinx", "german")


def test_auto_falls_back_to_pocketsphinx_without_a_cached_whisper(monkeypatch: Any) -> None:
    from engine.asr import recognizer as asr

    monkeypatch.delenv(asr.ENV_VAR, raising=False)
    monkeypatch.setattr(asr, "find_whisper", lambda: None)
    assert asr.describe(None) == "pocketsphinx" and asr.describe("auto") == "pocketsphinx"
    monkeypatch.setenv(asr.ENV_VAR, "some/folder")
    assert asr.describe(None) == "some/folder"


def test_slice_texts_from_word_times() -> None:
    from engine.prepare.transcripts import texts_from_words

    words = [["one", 0.1, 0.4], ["two", 0.5, 0.9], ["three", 2.1, 2.5], ["four", 2.6, 3.0],
             ["five", 1.95, 2.05]]
    assert texts_from_words(words, [(0.0, 1.0), (2.0, 3.2)]) == ["one two", "three four five"]
    assert texts_from_words([], [(0.0, 1.0)]) is None
    assert texts_from_words([["x"]], [(0.0, 1.0)]) is None
