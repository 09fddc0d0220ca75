"""The stage's reward: the evaluation's own measures of a render, weighted into one number.

A `Scorer` holds the recogniser and the independent speaker encoder (the evaluation's
`Meter`, loaded once per scorer, never per render) and the speaker's held-out clips
(`Reference`: their centroid and the speaker's own speaking rate). `terms` measures one
render; `reward` weighs the terms with the voice's [reinforce] settings
(`engine.config.reinforce`, where the formula is written out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.config.reinforce import ReinforceConfig
from engine.core.events import Emitter, as_emitter
from engine.layout.voice import Voice
from engine.quality.evaluate import MAX_REFERENCES, Meter, Reference

#: the terms each render is scored on, logged per iteration as `reinforce/<term>`
TERMS = ("similarity", "wer", "capped", "rate_off")


def rate_off(ratio: float | None, low: float, high: float) -> float:
    """How far a speaking-rate ratio lies outside [low, high], in log ratio (0 inside or
    unknown)."""
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return 0.0
    return max(0.0, math.log(ratio / high), math.log(low / ratio))


def reward(terms: dict[str, float], cfg: ReinforceConfig) -> float:
    """One render's reward from its terms (see `engine.config.reinforce`)."""
    return (cfg.similarity_weight * terms["similarity"] - cfg.wer_weight * min(terms["wer"], 1.0)
            - cfg.capped_weight * terms["capped"] - cfg.rate_weight * terms["rate_off"])


@dataclass
class Scorer:
    """The recogniser, the encoder and the speaker's held-out clips, loaded once."""

    meter: Meter
    reference: Reference
    language: str | None
    cfg: ReinforceConfig

    @classmethod
    def load(cls, voice: Voice, run_dir: Path, cfg: ReinforceConfig, asr: Any = None,
             device: str | None = None, emitter: Emitter | None = None) -> Scorer:
        em = emitter or as_emitter(None)
        # no base model: the model's own encoder is never a reward (it is not independent)
        meter = Meter(asr, None, device, em)
        return cls(meter, meter.reference(voice, run_dir, MAX_REFERENCES), voice.language, cfg)

    def terms(self, audio: np.ndarray, sample_rate: int, text: str, capped: bool
              ) -> dict[str, float]:
        """The terms of one render (`TERMS`); a capped render's rate says nothing (0)."""
        m = self.meter.measure(audio, sample_rate, text, self.reference, self.language)
        wer = m.get("wer")
        return {"similarity": float(m.get("similarity") or 0.0),
                "wer": 1.0 if wer is None else float(wer),
                "capped": 1.0 if capped else 0.0,
                "rate_off": 0.0 if capped else rate_off(m.get("rate_ratio"), self.cfg.rate_low,
                                                        self.cfg.rate_high)}

    def score(self, audio: np.ndarray, sample_rate: int, text: str, capped: bool
              ) -> dict[str, float]:
        """The terms of one render and its `reward`."""
        t = self.terms(audio, sample_rate, text, capped)
        return {"reward": reward(t, self.cfg), **t}
