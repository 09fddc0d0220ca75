"""Is a style obeyed? Render the same sentences plainly and with each style, measure both.

For a voice trained with style descriptions, every sentence is rendered once without an
instruction and once per style, with one seed and no loudness levelling (levelling
would hide "quietly" and "loudly"); each render is measured as prepare measures clips
(`engine.prepare.styles.measure_clip`), and each style's words that name a measured
direction ("slowly", "whisper", ...) are checked against the plain render of the same
sentence (`obedience`). Per style: how many checks were made, how many went the right
way, and the mean change of each measure it names. A style with no measurable word
(e.g. "as if you just heard great news") checks nothing and says so. With `measure`
(the evaluation's figures of one render: similarity, word errors), each style also
carries the mean of those figures over its renders, and "plain" those of the plain ones.

The tiny test model speaks noise, so on it this proves the mechanics only; on real
weights it is the measure of whether a style moves the voice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.prepare.styles import measure_clip, obedience
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import VoiceSource, trained_styles


def style_obedience(synth: Synthesizer, sentences: Sequence[str],
                    styles: Sequence[str] | None = None, options: SpeakOptions | None = None,
                    on_event: EventCallback | Emitter | None = None,
                    measure: Callable[[np.ndarray, int, str], dict[str, Any]] | None = None
                    ) -> dict[str, Any]:
    """{"styles": {style: {"checked", "obeyed", "share", "moves"}}, "sentences": n}.

    styles: default, those the loaded voice was trained with (refused when it has none).
    measure(audio, sample_rate, text): figures of one render; their means over a style's
    renders join its entry, and over the plain renders make "plain".
    """
    em = as_emitter(on_event)
    source: VoiceSource = synth.source
    styles = list(styles) if styles is not None else trained_styles(source)
    if not styles:
        raise InputError(f"{source.label} was trained without styles, so there is no style "
                         "to check.", "Give the styles to check, or train with styles.")
    if not sentences:
        raise InputError("No sentences to render.", "Give at least one sentence.")
    base = dataclasses.replace(options or SpeakOptions(), loudness_lufs=None, instruct=None,
                               seed=(options.seed if options and options.seed is not None
                                     else 0))

    figures: dict[str | None, list[dict[str, Any]]] = {}

    def measured(text: str, style: str | None) -> Any:
        speech = synth.speak(text, dataclasses.replace(base, instruct=style), em)
        if measure is not None:
            figures.setdefault(style, []).append(measure(speech.audio, speech.sample_rate,
                                                         text))
        return measure_clip(speech.audio, speech.sample_rate, text)

    plain = [measured(s, None) for s in sentences]
    out: dict[str, Any] = {}
    for k, style in enumerate(styles):
        em.progress("styles", k, len(styles), style=style)
        checks = [obedience(style, p, measured(s, style))
                  for s, p in zip(sentences, plain, strict=True)]
        checked = sum(c["checked"] for c in checks)
        obeyed = sum(c["obeyed"] for c in checks)
        words = sorted({w for c in checks for w in c["moves"]})
        out[style] = {
            "checked": checked, "obeyed": obeyed,
            "share": round(obeyed / checked, 3) if checked else None,
            "moves": {w: round(float(np.mean([c["moves"][w] for c in checks
                                              if w in c["moves"]])), 3) for w in words},
            **_means(figures.get(style, []))}
    em.progress("styles", len(styles), len(styles))
    found: dict[str, Any] = {"styles": out, "sentences": len(sentences)}
    if measure is not None:
        found["plain"] = _means(figures.get(None, []))
    return found


def _means(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The mean of each number `measure` gave, over the renders that have it."""
    keys = dict.fromkeys(k for r in rows for k, v in r.items()
                         if isinstance(v, int | float) and not isinstance(v, bool))
    out: dict[str, float | None] = {}
    for key in keys:
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)
                and np.isfinite(r[key])]
        out[key] = round(float(np.mean(vals)), 4) if vals else None
    return out

