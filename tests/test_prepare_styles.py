"""Style measures on real speech (piper), their words against the speaker's own baseline,
and the descriptions a prepared voice carries: measured, recorded, or written by the user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from piper import SynthesisConfig

from engine.cli.main import main
from engine.layout.manifest import prepared_folder, read_manifest
from engine.layout.voice import create_voice, open_voice
from engine.prepare.pipeline import prepare
from engine.prepare.styles import (
    BY_YOU,
    MEASURED,
    RECORDED,
    StyleMeasures,
    baseline,
    describe,
    measure_clip,
    obedience,
)
from tests.helpers.speech import SENTENCES, load_piper

RATE = 22050


@pytest.fixture(scope="module")
def say() -> Any:
    voice = load_piper()

    def synth(text: str, length_scale: float = 1.0, gain: float = 0.5) -> np.ndarray:
        cfg = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=length_scale)
        audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text, cfg)])
        return (gain * audio).astype(np.float32)

    return synth


@pytest.fixture(scope="module")
def usual(say: Any) -> StyleMeasures:
    return baseline(measure_clip(say(s), RATE, s) for s in SENTENCES[:6])


def _whisper(audio: np.ndarray) -> np.ndarray:
    """The same words as noise shaped by the speech's envelope: no pitch, as a whisper."""
    frame = 220
    env = np.sqrt(np.convolve(audio ** 2, np.ones(frame) / frame, mode="same"))
    noise = np.random.default_rng(0).standard_normal(len(audio))
    return (env * noise).astype(np.float32)


def test_each_measure_moves_the_way_the_speech_does(say: Any, usual: StyleMeasures) -> None:
    text = SENTENCES[0]
    plain = measure_clip(say(text), RATE, text)
    slow = measure_clip(say(text, length_scale=1.6), RATE, text)
    fast = measure_clip(say(text, length_scale=0.65), RATE, text)
    assert slow.rate < plain.rate / 1.3 and fast.rate > plain.rate * 1.3
    quiet = measure_clip(say(text, gain=0.05), RATE, text)
    assert quiet.loudness_db == pytest.approx(plain.loudness_db - 20.0, abs=0.5)
    whisper = measure_clip(_whisper(say(text)), RATE, text)
    assert whisper.voicing < 0.3 * plain.voicing
    # the same samples played 30 % faster: every pitch 4.5 semitones higher
    high = measure_clip(say(text), int(RATE * 1.3), text)
    assert high.pitch_st - plain.pitch_st == pytest.approx(12 * np.log2(1.3), abs=0.6)
    gap = np.zeros(int(0.9 * RATE), dtype=np.float32)
    two = f"{SENTENCES[1]} {SENTENCES[2]}"
    paused = measure_clip(np.concatenate((say(SENTENCES[1]), gap, say(SENTENCES[2]))), RATE, two)
    assert paused.pauses > plain.pauses + 0.15
    assert describe(plain, usual) == ""
    assert describe(slow, usual) == "Speak slowly."
    assert describe(fast, usual) == "Speak quickly."
    assert "quietly" in describe(quiet, usual)
    assert "whispering" in describe(whisper, usual)
    assert "in a high voice" in describe(high, usual)
    assert "with long pauses" in describe(paused, usual)


def test_obedience_checks_the_words_it_can_measure(say: Any) -> None:
    text = SENTENCES[3]
    plain = measure_clip(say(text), RATE, text)
    slow = measure_clip(say(text, length_scale=1.5), RATE, text)
    assert obedience("Slowly and calmly.", plain, slow) == {
        "checked": 1, "obeyed": 1,
        "moves": {"slow": pytest.approx(slow.rate - plain.rate, abs=1e-3)}}
    assert obedience("Quickly!", plain, slow)["obeyed"] == 0
    assert obedience("Like a pirate.", plain, slow)["checked"] == 0


def test_a_prepared_voice_describes_its_clips_and_the_user_can_edit_them(
        say: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    voice = create_voice(tmp_path / "ana", "Ana")
    takes = {f"plain{i}": voice.add_take(say(text), text, sample_rate=RATE).id
             for i, text in enumerate(SENTENCES[:6])}
    takes["slow"] = voice.add_take(say(SENTENCES[6], length_scale=1.7), SENTENCES[6],
                                   sample_rate=RATE).id
    takes["told"] = voice.add_take(say(SENTENCES[7]), SENTENCES[7], sample_rate=RATE,
                                   extra={"style": "Read this as if you just heard great news."}
                                   ).id
    report = prepare(voice)
    by_take = {r["source_take"]: r for r in read_manifest(voice.path, usable_only=False)}
    rows = {name: by_take[take] for name, take in takes.items()}
    assert rows["slow"]["style"] == "Speak slowly." and rows["slow"]["style_source"] == MEASURED
    assert rows["told"]["style"].startswith("Read this") and rows["told"]["style_source"] \
        == RECORDED
    assert [rows[f"plain{i}"]["style"] for i in range(6)] == [""] * 6, report["style_baseline"]
    measured = {c["id"]: c["style"] for c in report["clips"]}
    assert set(measured[rows["slow"]["id"]]) == {"rate", "pitch_st", "pitch_range_st",
                                                 "loudness_db", "voicing", "pauses"}
    assert set(open_voice(voice.path).styles) == {"Speak slowly.", rows["told"]["style"]}

    clip = rows["plain0"]["id"]
    assert main(["voice", "style", str(voice.path), clip, "Whisper."]) == 0
    assert main(["voice", "style", str(voice.path), "nope", "Whisper."]) != 0
    capsys.readouterr()
    after = {r["id"]: r for r in read_manifest(voice.path)}
    assert after[clip]["style"] == "Whisper." and after[clip]["style_source"] == BY_YOU
    assert "Whisper." in open_voice(voice.path).styles
    prepare(voice)  # the user's description lasts through the next prepare
    assert {r["id"]: r for r in read_manifest(voice.path)}[clip]["style"] == "Whisper."
    assert json.loads(prepared_folder(voice.path).styles.read_text()) == {clip: "Whisper."}
    assert main(["voice", "styles", str(voice.path)]) == 0
    listed = capsys.readouterr().out
    assert f"{clip}" in listed and "Whisper.  [you]" in listed
    assert main(["voice", "style", str(voice.path), clip, "--measured"]) == 0
    assert {r["id"]: r for r in read_manifest(voice.path)}[clip]["style"] == ""


def test_a_take_file_keeps_its_style(tmp_path: Path, say: Any) -> None:
    voice = create_voice(tmp_path / "bo", "Bo")
    take = voice.add_take(say(SENTENCES[0]), SENTENCES[0], sample_rate=RATE,
                          extra={"style": "Whisper."})
    again = next(t for t in open_voice(voice.path).list_takes() if t.id == take.id)
    assert again.extra["style"] == "Whisper."
    sf.info(again.audio_path)  # a real take on disk


def test_style_prompts_carry_their_description_in_every_language() -> None:
    from engine.layout.prompts import list_prompt_sets, parse_prompt_set

    for ps in list_prompt_sets():
        styled = [p for p in ps.prompts if p.style]
        assert len({p.style for p in styled}) == 5, ps.name  # slow, fast, whisper, loud, happy
        assert all(not p.style for p in ps.prompts if not p.id.startswith("st-"))
    made = parse_prompt_set("[calm | Speak  calmly.]\na | One.\n[plain]\nb | Two.\n", "x")
    assert [(p.id, p.group, p.style) for p in made.prompts] == [
        ("a", "calm", "Speak calmly."), ("b", "plain", "")]
    assert made.prompts[0].to_dict()["style"] == "Speak calmly."
