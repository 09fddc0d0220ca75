"""The speaking rate in the first and last third of a render (does speech hurry as it goes?).

Real speech at two known paces (piper's voice read slowly, then quickly, or the other way
round) heard by the evaluation's own recogniser.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from piper import SynthesisConfig

from engine.asr.recognizer import Word, load_recognizer, to_16k
from engine.quality.rate_thirds import RATE_THIRDS, rate_thirds
from tests.helpers.speech import load_piper

TEXT = ("The old lighthouse keeper climbed the narrow stairs every evening, "
        "lit the great lamp, and watched the ships pass safely through the night.")


@pytest.fixture(scope="module")
def paces() -> dict[str, Any]:
    voice = load_piper()

    def read(length_scale: float) -> np.ndarray:
        config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=length_scale)
        return np.concatenate([c.audio_float_array for c in voice.synthesize(TEXT, config)])

    return {"slow": read(1.6), "quick": read(0.8), "rate": int(voice.config.sample_rate)}


@pytest.mark.parametrize(("order", "hurried"), [(("slow", "quick"), True),
                                                (("quick", "slow"), False)])
def test_a_render_that_speeds_up_has_a_faster_last_third(paces: dict[str, Any],
                                                         order: tuple[str, str],
                                                         hurried: bool) -> None:
    audio = np.concatenate([paces[order[0]], paces[order[1]]]).astype(np.float32)
    heard = load_recognizer("pocketsphinx").transcribe(to_16k(audio, paces["rate"]), "en")
    figures = rate_thirds(heard.words)
    assert set(figures) == set(RATE_THIRDS)
    drift = figures["rate_drift"]
    assert drift is not None
    # the quick reading is twice as fast: the thirds tell which end it is at
    assert (drift > 1.3) if hurried else (drift < 1 / 1.3), figures


def test_an_even_pace_has_no_drift_and_too_few_words_say_nothing() -> None:
    even = [Word(f"w{i}", 0.4 * i, 0.4 * i + 0.3) for i in range(12)]
    assert rate_thirds(even)["rate_drift"] == pytest.approx(1.0)
    assert rate_thirds(even[:4]) == dict.fromkeys(RATE_THIRDS)
