"""The quality gate: issue codes, which of them make a clip unusable, and the checks.

A clip issue is `{"code", "message"}` (the manifest contract). Codes in
BLOCKING make the clip unusable for training; the others are advice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.audio.conditions import REVERB_BLOCK_S, REVERB_WARN_S
from engine.config import PrepareConfig
from engine.text import comparison_key

#: clip issue codes that make a clip unusable
BLOCKING = frozenset({
    "too_short", "too_long", "empty_text", "needs_transcript", "clipping", "low_snr",
    # engine/prepare/target.py: not the voice's speaker, two voices at once, or left out
    # by the user on the Prepare page (prepared/decisions.json)
    "another_speaker", "overlap", "excluded_by_you",
    # engine/audio/conditions.py: the room's echo is part of every word
    "too_reverberant",
})
#: clip issue codes that are advice only
WARNINGS = frozenset({
    "minor_clipping", "noisy", "dc_offset", "text_estimated", "duplicate_text", "peak_limited",
    "speaker_kept", "reverberant", "music_bed", "denoised",
})
#: the speaker decisions a user can overrule on the Prepare page
SPEAKER_CODES = frozenset({"another_speaker", "overlap"})

#: more than this fraction of full-scale samples is audible distortion
CLIP_FRACTION_BLOCK = 1e-3
#: a few full-scale samples (a plosive) are worth a note only from this many on
CLIP_SAMPLES_WARN = 3
NOISY_MARGIN_DB = 10.0
DC_WARN = 0.02
#: speech peaks 22+ dB over its loudness are common; a few dB quieter is harmless
PEAK_LIMIT_WARN_DB = 6.0


def issue(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def is_usable(issues: list[dict[str, str]]) -> bool:
    return not any(i["code"] in BLOCKING for i in issues)


@dataclass(frozen=True)
class ClipFacts:
    duration_s: float
    text: str
    text_method: str
    clipped_samples: int
    source_samples: int
    snr_db: float
    dc_offset: float
    gain_shortfall_db: float  # how far below the loudness target the peak ceiling left it
    rt60_s: float | None = None  # the room's reverberation time, when it could be measured
    music_bed: bool = False  # music (tonal background) under the speech


def clipping_issue(clipped_samples: int, samples: int) -> dict[str, str] | None:
    """The clipping verdict on `clipped_samples` of `samples`: "clipping" (unusable),
    "minor_clipping" (advice) or None, for the samples of one clip's span
    (engine.prepare.check.slice_facts)."""
    frac = clipped_samples / max(1, samples)
    if frac > CLIP_FRACTION_BLOCK:
        return issue("clipping", f"{frac:.2%} of the samples are clipped.")
    if clipped_samples >= CLIP_SAMPLES_WARN:
        return issue("minor_clipping", f"{clipped_samples} samples touch full scale.")
    return None


def check_clip(f: ClipFacts, cfg: PrepareConfig) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    lo, hi = cfg.min_clip_s, cfg.max_clip_s
    if f.duration_s < lo:
        out.append(issue("too_short", f"{f.duration_s:.2f} s is shorter than {lo:g} s."))
    elif f.duration_s > hi:
        out.append(issue("too_long", f"{f.duration_s:.1f} s is longer than {hi:g} s and has no "
                                     "pause to cut at."))
    if f.text_method == "none":
        out.append(issue("needs_transcript", "The transcript could not be split reliably "
                                             "across the slices; type this clip's text."))
    elif not f.text.strip():
        out.append(issue("empty_text", "There is no transcript."))
    elif f.text_method == "proportional":
        out.append(issue("text_estimated", "Text assigned by length; check it matches."))
    clipping = clipping_issue(f.clipped_samples, f.source_samples)
    clipped = clipping is not None and clipping["code"] == "clipping"
    if clipping is not None:
        out.append(clipping)
    min_snr = cfg.min_snr_db
    if f.snr_db < min_snr:
        out.append(issue("low_snr", f"Speech is only {f.snr_db:.0f} dB above the background "
                                    f"(needs {min_snr:g} dB)."))
    elif f.snr_db < min_snr + NOISY_MARGIN_DB:
        out.append(issue("noisy", f"Background noise is audible ({f.snr_db:.0f} dB SNR)."))
    if f.rt60_s is not None and f.rt60_s >= REVERB_BLOCK_S:
        out.append(issue("too_reverberant", f"Strong room echo (reverberation time "
                                            f"{f.rt60_s:.1f} s)."))
    elif f.rt60_s is not None and f.rt60_s >= REVERB_WARN_S:
        out.append(issue("reverberant", f"Audible room echo (reverberation time "
                                        f"{f.rt60_s:.1f} s)."))
    # clipping's harmonics and the speech the detector misses in a clipped take make its
    # pauses read as tonal: the clipping is the cause to name, not a music bed
    if f.music_bed and not clipped:
        out.append(issue("music_bed", "Music or another tonal sound plays under the speech."))
    if abs(f.dc_offset) > DC_WARN:
        out.append(issue("dc_offset", f"DC offset {f.dc_offset:+.3f} (removed)."))
    if f.gain_shortfall_db > PEAK_LIMIT_WARN_DB:
        out.append(issue("peak_limited", f"{f.gain_shortfall_db:.1f} dB under the loudness "
                                         "target to keep peaks from clipping."))
    return out


def mark_duplicates(entries: list[dict[str, Any]]) -> None:
    """Note every clip whose text was already read in an earlier clip (in place)."""
    first: dict[str, str] = {}
    for e in entries:
        key = comparison_key(e.get("text", ""))
        if not key:
            continue
        if key in first:
            e["issues"].append(issue("duplicate_text", f"Same text as clip {first[key]}."))
        else:
            first[key] = e["id"]
