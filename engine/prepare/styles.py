"""How a clip is spoken, measured, and put into words against the speaker's own baseline.

The approach of huggingface/dataspeech: measure what a listener hears as style, then
turn the measures into a short text description. Here the words come from how a clip
differs from the same speaker's usual delivery (the median over the voice's clips), not
from absolute bins: "slowly" means slower than this speaker usually speaks.

Measures of one clip (`measure_clip`):
- `rate`: letters and digits of the transcript per second of speech (the span from the
  first to the last active frame, less its pauses); a proxy for syllables per second
  that works in any script;
- `pitch_st`: median pitch of voiced frames, in semitones above 100 Hz;
- `pitch_range_st`: spread of the pitch (10th to 90th percentile), in semitones;
- `loudness_db`: mean power of the active frames (dBFS), measured before prepare
  normalises the clip's loudness;
- `voicing`: the share of active frames with a clear pitch (low in a whisper, lower in a
  breathy voice than in a full one);
- `pauses`: the share of the speech span spent in pauses of 0.25 s or more.

Prepare measures every clip (`measures` in the report), and the manifest row gets its
`style`: the user's own description (`set_clip_style`, kept in prepared/styles.json),
else the style the take was recorded in, else the measured words (`describe_entries`).

Pitch comes from a YIN-style difference function on 40 ms frames every 10 ms (60 to
420 Hz). Every threshold that turns a difference into a word is a constant below.
Light: numpy (scipy to resample for pitch).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.io import read_mono
from engine.audio.timebase import SAMPLE_RATE as CLIP_RATE
from engine.core.atomic import read_json, write_json
from engine.core.errors import InputError
from engine.layout.manifest import prepared_folder, read_manifest, write_manifest
from engine.layout.voice import open_voice

FRAME_S, HOP_S = 0.04, 0.01
F0_MIN, F0_MAX = 60.0, 420.0
#: pitch is tracked at this rate (the fundamental and its first harmonics are below 4 kHz)
PITCH_RATE = 8000
#: YIN threshold on the cumulative-mean-normalised difference: below it a frame is voiced
VOICED_BELOW = 0.25
#: a frame is active when its power is within this many dB of the clip's loud frames
ACTIVE_WITHIN_DB = 30.0
#: silences at least this long inside the speech are pauses
PAUSE_S = 0.25

#: the words, and how far from the speaker's baseline a clip must be to earn them
RATE_RATIO = 0.15  # 15 % slower or faster
PITCH_ST = 3.0  # three semitones lower or higher (a question rises by about two)
RANGE_RATIO = (0.6, 1.6)  # below: monotone, above: expressive
LOUDNESS_DB = 4.0
WHISPER_VOICING, BREATHY_VOICING = 0.4, 0.6  # share of the baseline's voicing
PAUSES_MORE = 0.12  # twelve points more of the span in pauses

MEASURES = ("rate", "pitch_st", "pitch_range_st", "loudness_db", "voicing", "pauses")


@dataclass(frozen=True)
class StyleMeasures:
    """What `measure_clip` hears in one clip (None: could not be measured)."""

    rate: float | None
    pitch_st: float | None
    pitch_range_st: float | None
    loudness_db: float | None
    voicing: float | None
    pauses: float | None

    def to_dict(self) -> dict[str, float | None]:
        return {k: (None if v is None else round(float(v), 3)) for k, v in asdict(self).items()}

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> StyleMeasures:
        return cls(**{k: (None if d.get(k) is None else float(d[k])) for k in MEASURES})


def _frames(audio: np.ndarray, rate: int) -> np.ndarray:
    size, hop = int(FRAME_S * rate), int(HOP_S * rate)
    if len(audio) < size:
        audio = np.pad(audio, (0, size - len(audio)))
    count = 1 + (len(audio) - size) // hop
    idx = np.arange(size)[None, :] + hop * np.arange(count)[:, None]
    return audio[idx]


def _pitch(frames: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(f0 Hz, voiced) per frame, YIN's cumulative-mean-normalised difference."""
    size = frames.shape[1]
    lo, hi = int(rate / F0_MAX), min(int(rate / F0_MIN), size - 1)
    x = frames - frames.mean(axis=1, keepdims=True)
    spec = np.fft.rfft(x, n=2 * size, axis=1)
    acf = np.fft.irfft(spec * np.conj(spec), axis=1)[:, :hi + 1]
    energy = np.cumsum(x[:, ::-1] ** 2, axis=1)[:, ::-1]  # energy of x[t:] for each t
    tail = np.concatenate((energy, np.zeros((len(x), 1))), axis=1)
    # d(tau) = sum x[t]^2 + sum x[t+tau]^2 - 2 r(tau), over the overlapping part
    head = np.cumsum(x ** 2, axis=1)
    taus = np.arange(hi + 1)
    d = head[:, size - 1 - taus] + tail[:, taus] - 2 * acf
    d[:, 0] = 0.0
    running = np.cumsum(d[:, 1:], axis=1) / np.arange(1, hi + 1)
    cmnd = np.ones_like(d)
    cmnd[:, 1:] = d[:, 1:] / np.maximum(running, 1e-12)
    search = cmnd[:, lo:hi + 1]
    best = search.argmin(axis=1)
    depth = search[np.arange(len(search)), best]
    f0 = rate / (lo + best).astype(np.float64)
    return f0, depth < VOICED_BELOW


def _to_pitch_rate(audio: np.ndarray, rate: int) -> np.ndarray:
    from scipy.signal import resample_poly  # noqa: PLC0415

    g = math.gcd(PITCH_RATE, rate)
    return resample_poly(audio, PITCH_RATE // g, rate // g) if rate != PITCH_RATE else audio


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def measure_clip(audio: np.ndarray, rate: int, text: str) -> StyleMeasures:
    """The style measures of one clip (mono float audio, its transcript)."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    frames = _frames(audio, rate)
    power_db = 10 * np.log10(np.mean(frames ** 2, axis=1) + 1e-12)
    active = power_db > np.percentile(power_db, 95) - ACTIVE_WITHIN_DB
    if not active.any():
        return StyleMeasures(None, None, None, None, None, None)
    first, last = np.flatnonzero(active)[[0, -1]]
    span = (last - first + 1) * HOP_S
    gaps = [(s, e) for s, e in _runs(~active[first:last + 1]) if (e - s) * HOP_S >= PAUSE_S]
    paused = sum(e - s for s, e in gaps) * HOP_S
    letters = len(re.findall(r"\w", text))
    speaking = max(span - paused, HOP_S)
    f0, voiced = _pitch(_frames(_to_pitch_rate(audio, rate), PITCH_RATE), PITCH_RATE)
    n = min(len(f0), len(active))
    f0, voiced = f0[:n], voiced[:n] & active[:n]
    pitch = range_st = None
    if voiced.sum() >= 5:
        st = 12 * np.log2(f0[voiced] / 100.0)
        pitch = float(np.median(st))
        range_st = float(np.percentile(st, 90) - np.percentile(st, 10))
    return StyleMeasures(
        rate=letters / speaking if letters else None, pitch_st=pitch, pitch_range_st=range_st,
        loudness_db=float(10 * np.log10(np.mean(10 ** (power_db[active] / 10)))),
        voicing=float(voiced.sum() / active[:n].sum()), pauses=paused / span if span else 0.0)


def baseline(measures: Iterable[StyleMeasures]) -> StyleMeasures:
    """The speaker's usual delivery: the median of each measure over their clips."""
    rows = list(measures)

    def median(name: str) -> float | None:
        vals = [getattr(m, name) for m in rows if getattr(m, name) is not None]
        return float(np.median(vals)) if vals else None

    return StyleMeasures(**{k: median(k) for k in MEASURES})


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base <= 0:
        return None
    return value / base


def style_words(m: StyleMeasures, base: StyleMeasures) -> list[str]:
    """The words for how `m` differs from the speaker's `base` ([]: as usual)."""
    words: list[str] = []
    rate = _ratio(m.rate, base.rate)
    if rate is not None and rate < 1 - RATE_RATIO:
        words.append("slowly")
    elif rate is not None and rate > 1 + RATE_RATIO:
        words.append("quickly")
    if m.loudness_db is not None and base.loudness_db is not None:
        if m.loudness_db < base.loudness_db - LOUDNESS_DB:
            words.append("quietly")
        elif m.loudness_db > base.loudness_db + LOUDNESS_DB:
            words.append("loudly")
    voicing = _ratio(m.voicing, base.voicing)
    if voicing is not None and voicing < WHISPER_VOICING:
        words.append("whispering")
    elif voicing is not None and voicing < BREATHY_VOICING:
        words.append("in a breathy voice")
    if m.pitch_st is not None and base.pitch_st is not None:
        if m.pitch_st < base.pitch_st - PITCH_ST:
            words.append("in a low voice")
        elif m.pitch_st > base.pitch_st + PITCH_ST:
            words.append("in a high voice")
    spread = _ratio(m.pitch_range_st, base.pitch_range_st)
    if spread is not None and spread < RANGE_RATIO[0]:
        words.append("in a monotone")
    elif spread is not None and spread > RANGE_RATIO[1]:
        words.append("with lively intonation")
    if m.pauses is not None and base.pauses is not None and m.pauses > base.pauses + PAUSES_MORE:
        words.append("with long pauses")
    return words


def describe(m: StyleMeasures, base: StyleMeasures) -> str:
    """A style description of the clip ("" when it sounds as the speaker usually does)."""
    words = style_words(m, base)
    if not words:
        return ""
    text = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return f"Speak {text}."


def obedience(asked: str, plain: StyleMeasures, styled: StyleMeasures) -> dict[str, Any]:
    """Did a render asked for `asked` move from the `plain` render the way its words say?

    Each word of the description that names a measured direction ("slowly", "loudly", ...)
    is checked: {"checked": n, "obeyed": k, "moves": {word: change}}; a description with no
    such word checks nothing.
    """
    text = asked.lower()
    checks = {"slow": ("rate", -1), "quick": ("rate", 1), "fast": ("rate", 1),
              "quiet": ("loudness_db", -1), "soft": ("loudness_db", -1),
              "loud": ("loudness_db", 1), "whisper": ("voicing", -1),
              "breathy": ("voicing", -1), "low voice": ("pitch_st", -1),
              "high voice": ("pitch_st", 1), "monoton": ("pitch_range_st", -1),
              "pause": ("pauses", 1)}
    moves: dict[str, float] = {}
    obeyed = 0
    for word, (name, sign) in checks.items():
        if word not in text:
            continue
        a, b = getattr(plain, name), getattr(styled, name)
        if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
            continue
        moves[word] = round(float(b - a), 3)
        obeyed += int((b - a) * sign > 0)
    return {"checked": len(moves), "obeyed": obeyed, "moves": moves}


def obeyed_share(asked: str, plain: StyleMeasures, styled: StyleMeasures) -> float:
    """The share of `asked`'s measurable words that moved the right way from `plain` to
    `styled` (`obedience`); 0 when it names none that could be measured."""
    found = obedience(asked, plain, styled)
    return found["obeyed"] / found["checked"] if found["checked"] else 0.0


def styles_obeyed(styles: dict[str, Any]) -> str:
    """A checkpoint's styles as the evaluation measured them (its entry's "styles"), in
    words: "styles obeyed 1 of 2 (1 not measurable)"; the report and the window say it."""
    count, measurable = int(styles.get("count") or 0), int(styles.get("measurable") or 0)
    if not measurable:
        return f"no measurable word in its {count} style(s)"
    rest = f" ({count - measurable} not measurable)" if count > measurable else ""
    return f"styles obeyed {styles.get('followed', 0)} of {measurable}{rest}"


# -- a voice's clips: measured in prepare, described, edited by the user ----------------------

#: where a clip's style description came from
BY_YOU, RECORDED, MEASURED = "you", "recorded", "measured"


def read_user_styles(voice_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The user's own descriptions: clip id -> text ("" = "no style": train it plain)."""
    data = read_json(prepared_folder(voice_dir).styles)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def describe_entries(entries: list[dict[str, Any]], measures: Mapping[str, Mapping[str, Any]],
                     take_styles: Mapping[str, str], user: Mapping[str, str]) -> StyleMeasures:
    """Give every manifest row its style (in place); returns the speaker's baseline.

    Precedence: the user's description of the clip, then the style its take was recorded
    in, then the words for what was measured against the baseline (the median of the
    usable clips). Each row keeps the measured description as `style_measured`.
    """
    usable = [StyleMeasures.of(measures[e["id"]]) for e in entries
              if e.get("usable", True) and e["id"] in measures]
    base = baseline(usable)
    for e in entries:
        measured = (describe(StyleMeasures.of(measures[e["id"]]), base)
                    if e["id"] in measures else "")
        e["style_measured"] = measured
        if e["id"] in user:
            e["style"], e["style_source"] = user[e["id"]].strip(), BY_YOU
        elif take_styles.get(e.get("source_take", "")):
            e["style"], e["style_source"] = take_styles[e["source_take"]].strip(), RECORDED
        else:
            e["style"], e["style_source"] = measured, MEASURED
    return base


#: at most this many clips measured for a speaker's plain delivery (spread over the set)
PLAIN_CLIPS = 24


def plain_baseline(voice_dir: str | os.PathLike[str], limit: int = PLAIN_CLIPS
                   ) -> StyleMeasures:
    """The speaker's plain delivery as training heard it: the median measures of their
    prepared clips with no style description (every usable clip when none is plain), at
    most `limit` spread over the set. Measured on the prepared audio, levelled as the
    training targets were, so a render's loudness compares with it."""
    rows = read_manifest(voice_dir)
    plain = [r for r in rows if not str(r.get("style") or "").strip()] or rows
    if not plain:
        raise InputError(f"The voice {Path(voice_dir).name} has no usable prepared clips to "
                         "measure its plain delivery on.", "Run `voxshard-engine prepare`.")
    picked = [plain[i * len(plain) // min(limit, len(plain))]
              for i in range(min(limit, len(plain)))]
    return baseline(measure_clip(read_mono(Path(voice_dir) / r["path"], CLIP_RATE), CLIP_RATE,
                                 str(r.get("text") or "")) for r in picked)


def voice_styles(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The distinct descriptions of the usable clips, most clips first."""
    counts: dict[str, int] = {}
    for e in entries:
        style = str(e.get("style") or "").strip()
        if style and e.get("usable", True):
            counts[style] = counts.get(style, 0) + 1
    return sorted(counts, key=lambda s: (-counts[s], s))


def set_clip_style(voice_dir: str | os.PathLike[str], clip_id: str, style: str | None) -> str:
    """Set (or with None, give back to the measures) one clip's description; returns it.

    Applies at once to the prepared manifest (what training reads) and lasts through the
    next prepare. An empty string says "this clip has no style" (it trains plain).
    """
    rows = read_manifest(voice_dir, usable_only=False)
    row = next((r for r in rows if r.get("id") == clip_id), None)
    if row is None:
        raise InputError(f"There is no prepared clip {clip_id!r}.",
                         "List the clips with `voxshard-engine voice styles VOICE`.")
    if style is not None and len(style) > 500:
        raise InputError("A style description must be at most 500 characters.",
                         "Describe how the clip is spoken in a sentence or two.")
    user = read_user_styles(voice_dir)
    if style is None:
        user.pop(clip_id, None)
        row["style"], row["style_source"] = str(row.get("style_measured") or ""), MEASURED
    else:
        user[clip_id] = style.strip()
        row["style"], row["style_source"] = style.strip(), BY_YOU
    write_json(prepared_folder(voice_dir).styles, user)
    write_manifest(voice_dir, rows)
    open_voice(voice_dir).set_styles(voice_styles(rows))
    return str(row["style"])
