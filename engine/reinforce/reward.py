"""The stage's reward: by default the evaluation's own measures of a render, weighted into
one number; `[reinforce] reward` may name another.

`load_reward` builds the reward `[reinforce] reward` names, once per process that scores
(the one-process stage, or the Ray rollout actor): "voice" (the default, `voice_reward`)
or an import spec "package.module:factory", a function given a `RewardContext` that
returns a `stage.Reward` (the renders of an iteration and its texts -> one score per
render, a number or a dict with "reward" and its terms). `reward_factory` imports the
spec and refuses one that cannot work in one sentence, before any cluster starts.

A `Scorer` holds the recogniser and the independent speaker encoder (the evaluation's
`Meter`, loaded once per scorer, never per render) and the speaker's held-out clips
(`Reference`: their centroid and the speaker's own speaking rate). `terms` measures one
render; `reward` weighs the terms with the voice's [reinforce] settings
(`engine.config.reinforce`, where the formula is written out). A render carries the
instruction its prompt had (`Render.style`, a trained style, or None); the style term
(`StyleTerm`) checks it, for a run trained with styles whose settings weigh it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.config.reinforce import VOICE_REWARD, ReinforceConfig
from engine.core.errors import InputError
from engine.core.events import Emitter, as_emitter
from engine.layout.run import Run
from engine.layout.voice import Voice
from engine.prepare.styles import StyleMeasures, measure_clip, obeyed_share, plain_baseline
from engine.quality.evaluate import MAX_REFERENCES
from engine.quality.measure import Meter, Reference
from engine.reinforce.stage import Reward

#: the terms each render is scored on, logged per iteration as `reinforce/<term>`
TERMS = ("similarity", "wer", "capped", "rate_off", "style")


def rate_off(ratio: float | None, low: float, high: float) -> float:
    """How far a speaking-rate ratio lies outside [low, high], in log ratio (0 inside or
    unknown)."""
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return 0.0
    return max(0.0, math.log(ratio / high), math.log(low / ratio))


def reward(terms: dict[str, float], cfg: ReinforceConfig) -> float:
    """One render's reward from its terms (see `engine.config.reinforce`)."""
    return (cfg.similarity_weight * terms["similarity"] - cfg.wer_weight * min(terms["wer"], 1.0)
            - cfg.capped_weight * terms["capped"] - cfg.rate_weight * terms["rate_off"]
            + cfg.style_weight * terms.get("style", 0.0))


@dataclass(frozen=True)
class StyleTerm:
    """Style obedience of one render: the speaker's plain delivery (`plain_baseline`),
    measured once, against which a styled render's measures must move the way its style's
    words say (`obeyed_share`)."""

    plain: StyleMeasures

    @classmethod
    def load(cls, voice: Voice, run_dir: Path, cfg: ReinforceConfig) -> StyleTerm | None:
        """The term of a run trained with styles whose settings weigh it; else None."""
        if cfg.style_weight <= 0 or not Run(run_dir).trained_styles():
            return None
        return cls(plain_baseline(voice.path))

    def __call__(self, style: str | None, audio: np.ndarray, sample_rate: int, text: str,
                 unended: bool) -> float:
        """0 for a plain render and for one that never ended (its measures say nothing)."""
        if not style or unended:
            return 0.0
        return obeyed_share(style, self.plain, measure_clip(audio, sample_rate, text))


@dataclass
class Scorer:
    """The recogniser, the encoder and the speaker's held-out clips, loaded once."""

    meter: Meter
    reference: Reference
    language: str | None
    cfg: ReinforceConfig
    #: style obedience (None: the settings do not weigh it, or the run has no styles)
    style: StyleTerm | None = None

    @classmethod
    def load(cls, voice: Voice, run_dir: Path, cfg: ReinforceConfig, asr: Any = None,
             device: str | None = None, emitter: Emitter | None = None) -> Scorer:
        em = emitter or as_emitter(None)
        # no base model: the model's own encoder is never a reward (it is not independent)
        meter = Meter(asr, None, device, em)
        return cls(meter, meter.reference(voice, run_dir, MAX_REFERENCES), voice.language, cfg,
                   StyleTerm.load(voice, run_dir, cfg))

    def terms(self, audio: np.ndarray, sample_rate: int, text: str, capped: bool,
              style: str | None = None) -> dict[str, float]:
        """The terms of one render (`TERMS`); a capped render's rate says nothing (0).
        `style`: the instruction its prompt carried."""
        m = self.meter.measure(audio, sample_rate, text, self.reference, self.language)
        wer = m.get("wer")
        return {"similarity": float(m.get("similarity") or 0.0),
                "wer": 1.0 if wer is None else float(wer),
                "capped": 1.0 if capped else 0.0,
                "rate_off": 0.0 if capped else rate_off(m.get("rate_ratio"), self.cfg.rate_low,
                                                        self.cfg.rate_high),
                "style": (self.style(style, audio, sample_rate, text, capped)
                          if self.style is not None else 0.0)}

    def score(self, audio: np.ndarray, sample_rate: int, text: str, capped: bool,
              style: str | None = None) -> dict[str, float]:
        """The terms of one render and its `reward`."""
        t = self.terms(audio, sample_rate, text, capped, style)
        return {"reward": reward(t, self.cfg), **t}


@dataclass(frozen=True)
class RewardContext:
    """What a reward factory is given (once per process that scores)."""

    voice: Voice
    run_dir: Path
    cfg: ReinforceConfig
    #: the loaded `models.StageModels`: `models.roller.audio(renders)` decodes renders to
    #: 24 kHz waveforms by the model's codec, `models.model` is the official model
    models: Any
    #: a recogniser spec or a loaded one (the request's --asr)
    asr: Any = None
    device: str | None = None
    emitter: Emitter | None = None


#: a reward factory: the context -> the stage's reward
RewardFactory = Callable[[RewardContext], Reward]


def voice_reward(ctx: RewardContext) -> Reward:
    """The stage's own reward: each render decoded and scored by a `Scorer` (loaded here,
    once)."""
    scorer = Scorer.load(ctx.voice, ctx.run_dir, ctx.cfg, ctx.asr, ctx.device, ctx.emitter)
    return lambda renders, texts: ctx.models.score(scorer, renders, texts)


def reward_factory(spec: str) -> RewardFactory:
    """The factory `[reinforce] reward` names (the config checked its form); InputError in
    one sentence when it cannot be imported or is no function."""
    if spec == VOICE_REWARD:
        return voice_reward
    module, _, name = spec.partition(":")
    hint = ("Set [reinforce] reward to \"voice\", or to \"package.module:factory\" of a module "
            "this Python (and every Ray node) can import.")
    try:
        factory = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # any failure of the user's module at import is theirs
        raise InputError(f"The reward {spec!r} cannot be imported ({type(exc).__name__}: "
                         f"{exc}).", hint) from exc
    if not callable(factory):
        raise InputError(f"The reward {spec!r} names no function: {module} has no callable "
                         f"{name!r}.", hint)
    return factory


def load_reward(ctx: RewardContext) -> Reward:
    """The reward `ctx.cfg.reward` names, built once."""
    return reward_factory(str(ctx.cfg.reward))(ctx)
