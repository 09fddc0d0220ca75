"""Instant voices (issue 30, tier 1): saved in the voice the moment it is prepared, from
the engine's reference clip and its words, listed by tier and speaking with no training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.audio.io import read_mono
from engine.catalog import list_tiers, voice_summary
from engine.cli.main import main
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.core.kinds import Tier, VoiceKind
from engine.layout.manifest import read_manifest, reference_clip
from engine.layout.tiers import read_instant
from engine.model.speaker_encoder import load_speaker_encoder, x_vector
from engine.prepare.instant import make_instant_voice
from engine.serve.voices import discover
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from tests.helpers.voices import copy_voice


@pytest.fixture
def voice(prepared_voice: Path, tmp_path: Path) -> Path:
    return copy_voice(prepared_voice, tmp_path / "joe")


def test_instant_voice_takes_the_engines_reference_clip_its_words_and_vector(
        voice: Path, tiny_model_dir: Path) -> None:
    instant = make_instant_voice(voice, str(tiny_model_dir))
    chosen = reference_clip(voice)
    assert chosen is not None and instant.clip_id == chosen.stem
    row = next(r for r in read_manifest(voice) if r["id"] == chosen.stem)
    assert instant.text == row["text"] and instant.base == str(tiny_model_dir)
    assert instant.clip.read_bytes() == chosen.read_bytes()  # a copy: prepare may drop clips
    want = x_vector(load_speaker_encoder(tiny_model_dir), read_mono(chosen, 24000))
    np.testing.assert_array_equal(instant.x_vector(), want)
    tiers = list_tiers(voice)
    assert [t["tier"] for t in tiers] == [Tier.INSTANT]
    assert tiers[0]["base"] == str(tiny_model_dir) and tiers[0]["size_bytes"] > 0
    assert voice_summary(voice)["tiers"] == tiers


def test_prepare_saves_the_instant_voice_and_it_speaks_untrained(
        voice: Path, tiny_model_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert read_instant(voice) is None
    assert main(["--json", "prepare", str(voice), "--base", str(tiny_model_dir)]) == 0
    result = json.loads(capfd.readouterr().out.splitlines()[-1])
    instant = read_instant(voice)
    assert instant is not None and result["instant"] == str(instant.folder)
    assert main(["voice", "tiers", str(voice)]) == 0
    assert "instant  instant" in capfd.readouterr().err  # the human summary
    # the voice has no export and no run: it speaks its instant voice, in context
    source = resolve_source(voice)
    assert source.kind == VoiceKind.ZERO_SHOT and source.label == Tier.INSTANT
    assert source.reference == instant.clip and source.reference_text == instant.text
    assert resolve_source(instant.folder).to_dict() == source.to_dict()
    synth = Synthesizer.load(source, device="cpu", dtype="float32")
    speech = synth.speak("Hello there.", SpeakOptions(seed=1, max_frames=20))
    assert speech.audio.size > 0


def test_an_instant_voice_without_a_base_asks_for_one(voice: Path) -> None:
    make_instant_voice(voice)  # no run, no base: saved without a speaker vector
    instant = read_instant(voice)
    assert instant is not None and instant.base is None and instant.x_vector() is None
    with pytest.raises(InputError, match="does not say its base model"):
        resolve_source(voice)


def _prepared_then_trained(voice: Path, trained_run: dict) -> Path:
    """The natural order (issue 45): prepared with no base chosen, then trained on one (the
    session run's real folder, trained from the tiny base, copied in)."""
    make_instant_voice(voice)
    assert read_instant(voice) is not None and read_instant(voice).base is None
    shutil.copytree(trained_run["run"], voice / "runs" / "r1")
    return voice


def test_an_instant_voice_speaks_on_the_base_its_runs_trained_from(
        voice: Path, trained_run: dict, tiny_model_dir: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    _prepared_then_trained(voice, trained_run)
    tiers = list_tiers(voice)
    assert [(t["tier"], t["base"]) for t in tiers] == [(Tier.INSTANT, str(tiny_model_dir))]
    assert main(["voice", "tiers", str(voice)]) == 0
    assert "base ?" not in capfd.readouterr().err
    source = resolve_source(voice / "instant")
    assert source.kind == VoiceKind.ZERO_SHOT and source.model_dir == tiny_model_dir
    # served: the instant voice is offered with its base, and it is the one a server loads
    served = discover([voice])
    assert served["joe/instant"].base == str(tiny_model_dir)


def test_a_base_given_to_an_instant_voice_without_one_is_recorded(
        voice: Path, tiny_model_dir: Path) -> None:
    make_instant_voice(voice)
    source = resolve_source(voice / "instant", base=str(tiny_model_dir))
    assert source.model_dir == tiny_model_dir
    assert read_instant(voice).base == str(tiny_model_dir)
    # and from then on it speaks on it with no base given, and is offered
    assert resolve_source(voice).model_dir == tiny_model_dir
    assert "joe/instant" in discover([voice])


def test_an_instant_voice_with_no_base_known_is_not_offered(voice: Path) -> None:
    make_instant_voice(voice)
    with pytest.raises(InputError) as err:
        discover([voice])  # it cannot speak: a server does not list it (and then 500)
    assert "does not know its base model" in err.value.message
    with pytest.raises(InputError) as err:
        resolve_source(voice)
    assert err.value.window_hint and "--" not in err.value.window_hint
