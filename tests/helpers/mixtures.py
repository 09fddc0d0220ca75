"""Realistic recordings built offline: a two-speaker interview under noise, music and echo.

Speaker A (the target) is piper's 'joe'; speaker B is the same voice pitch-shifted
up 6 semitones, which the speaker encoder tells apart (mean similarity ~0.43
against ~0.9 for the same voice). They alternate turns with pauses, and twice
B starts before A has finished (a short overlap). The truth (who speaks where)
is known to the sample, so a test can score what prepare kept.

`build_mixtures(...)` is plain Python (bench/bench_prepare.py --mixtures uses
it too); the session fixture `mixtures` builds them once from the sentences
`piper_sentences` already synthesised, so the suite pays for no extra speech.

Conditions: clean; white and pink noise at 20, 10 and 5 dB SNR; a music bed
(chords and drums from numpy) 15 dB under the speech; a synthetic room
(exponentially decaying noise impulse response, RT60 0.6 s).

A fixture plugin (tests/conftest.py registers it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np
import pytest

RATE = 24000
#: who reads which sentence, in order: A (the interviewee) speaks most, so A is the
#: dominant speaker; two more sentences are A's clean "recorded takes" for enrolment
ORDER = (("A", 0), ("B", 1), ("A", 2), ("B", 3), ("A", 4), ("B", 5), ("A", 6), ("B", 7),
         ("A", 8), ("A", 9))
ENROL_SENTENCES = (10, 11)
PAUSE_S = 0.6
#: B's turns at these indices start this long before A's previous turn ends
OVERLAP_TURNS = (1, 3)
OVERLAP_S = 0.5
CONDITIONS = ("clean", "white20", "white10", "white5", "pink20", "pink10", "pink5",
              "music15", "reverb")


@dataclass
class Mixture:
    name: str
    audio: np.ndarray  # float32 mono at RATE
    #: (speaker, start, end) in samples: speaker "A" (target) or "B"; first to last voiced sample
    turns: list[tuple[str, int, int]]
    texts: list[str]
    enrolment: list[np.ndarray] = field(default_factory=list)

    def speaker_mask(self, speaker: str) -> np.ndarray:
        mask = np.zeros(len(self.audio), dtype=bool)
        for who, a, b in self.turns:
            if who == speaker:
                mask[a:b] = True
        return mask


def _to_rate(audio: np.ndarray, sr: int) -> np.ndarray:
    from scipy.signal import resample_poly

    if sr == RATE:
        return audio.astype(np.float32)
    g = gcd(RATE, sr)
    return resample_poly(audio, RATE // g, sr // g).astype(np.float32)


def _voiced(audio: np.ndarray) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(audio) > 0.02 * float(np.abs(audio).max()))
    return int(loud[0]), int(loud[-1]) + 1


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """1/f noise: white noise shaped by 1/sqrt(f) in the frequency domain."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    return np.fft.irfft(spec / np.sqrt(f), n)


def _music(n: int, rng: np.random.Generator) -> np.ndarray:
    """A bed of chords (triads of harmonic tones, a new chord every 2 s) and drums
    (a kick on every beat at 120 bpm, a noise hi-hat on the off-beats)."""
    t = np.arange(n) / RATE
    out = np.zeros(n)
    roots = (220.0, 174.6, 196.0, 261.6)  # A3, F3, G3, C4
    bar = 2 * RATE
    for k, start in enumerate(range(0, n, bar)):
        seg = slice(start, min(n, start + bar))
        root = roots[k % len(roots)]
        for ratio in (1.0, 1.26, 1.5):  # a major triad
            for h in (1, 2, 3):
                out[seg] += np.sin(2 * np.pi * root * ratio * h * t[seg]) / (h * h)
    beat = RATE // 2
    kick = np.sin(2 * np.pi * 55 * np.arange(beat // 2) / RATE) * np.exp(
        -np.arange(beat // 2) / (0.05 * RATE))
    hat = rng.standard_normal(beat // 8) * np.exp(-np.arange(beat // 8) / (0.01 * RATE))
    for start in range(0, n - beat, beat):
        out[start:start + len(kick)] += 4.0 * kick
        off = start + beat // 2
        out[off:off + len(hat)] += 1.5 * np.diff(hat, prepend=0.0)
    return out


def _room(audio: np.ndarray, rng: np.random.Generator, rt60: float = 0.6) -> np.ndarray:
    """Convolution with a synthetic impulse response: the direct sound, then
    noise decaying 60 dB in `rt60` seconds (a diffuse reverberant tail)."""
    from scipy.signal import fftconvolve

    n = int(rt60 * RATE)
    tail = rng.standard_normal(n) * np.exp(-6.9 * np.arange(n) / n) * 0.3
    tail[: int(0.005 * RATE)] = 0.0  # first reflections after 5 ms
    ir = np.concatenate([[1.0], tail])
    wet = fftconvolve(audio, ir)[: len(audio)]
    return wet * (float(np.abs(audio).max()) / float(np.abs(wet).max()))


def build_interview(pieces: list[tuple[str, np.ndarray]], texts: list[str]) -> Mixture:
    """Turns in order (all at RATE) with pauses; B's turns at OVERLAP_TURNS start
    before the previous turn has ended."""
    pause = int(PAUSE_S * RATE)
    total = sum(len(p) for _, p in pieces) + pause * (len(pieces) + 1)
    audio = np.zeros(total)
    turns: list[tuple[str, int, int]] = []
    pos = pause
    b_index = 0
    for who, clip in pieces:
        lo, hi = _voiced(clip)
        start = pos - lo  # the clip's own leading silence overlaps the pause
        if who == "B":
            if b_index in OVERLAP_TURNS:
                start = turns[-1][2] - int(OVERLAP_S * RATE) - lo
            b_index += 1
        audio[start:start + len(clip)] += clip
        turns.append((who, start + lo, start + hi))
        pos = start + hi + pause
    end = pos
    return Mixture("clean", audio[:end].astype(np.float32), turns, texts)


def condition(clean: Mixture, name: str, seed: int = 7) -> Mixture:
    """The interview under one of CONDITIONS (levels relative to the speech's power)."""
    rng = np.random.default_rng(seed)
    x = clean.audio.astype(np.float64)
    speech = clean.speaker_mask("A") | clean.speaker_mask("B")
    power = float(np.mean(x[speech] ** 2))
    n = len(x)
    if name == "clean":
        out = x
    elif name.startswith(("white", "pink")):
        snr = float(name[5:] if name.startswith("white") else name[4:])
        noise = rng.standard_normal(n) if name.startswith("white") else pink_noise(n, rng)
        noise *= np.sqrt(power / 10 ** (snr / 10) / float(np.mean(noise ** 2)))
        out = x + noise
    elif name.startswith("music"):
        bed = _music(n, rng)
        bed *= np.sqrt(power / 10 ** (float(name[5:]) / 10) / float(np.mean(bed ** 2)))
        out = x + bed
    elif name == "reverb":
        out = _room(x, rng)
    else:
        raise ValueError(f"unknown condition {name!r}")
    peak = float(np.abs(out).max())
    if peak > 0.95:
        out = out * (0.95 / peak)
    return Mixture(name, out.astype(np.float32), clean.turns, clean.texts, clean.enrolment)


def pitch_shift(audio: np.ndarray, semitones: float = 6.0) -> np.ndarray:
    import librosa

    return librosa.effects.pitch_shift(audio.astype(np.float32), sr=RATE,
                                       n_steps=semitones).astype(np.float32)


def build_mixtures(sentences: list[tuple[np.ndarray, int, str]],
                   names: tuple[str, ...] = CONDITIONS) -> dict[str, Mixture]:
    """`sentences`: (audio, sample_rate, text) of at least 12 sentences of one voice."""
    clips = [_to_rate(a, sr) for a, sr, _ in sentences]
    pieces = [(who, clips[i] if who == "A" else pitch_shift(clips[i])) for who, i in ORDER]
    clean = build_interview(pieces, [sentences[i][2] for _, i in ORDER])
    clean.enrolment = [clips[i] for i in ENROL_SENTENCES]
    return {name: condition(clean, name) for name in names}


def write_mixture(m: Mixture, folder: Path) -> dict[str, Path]:
    """The interview and the enrolment takes as WAV files in `folder`."""
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    out = {"interview": folder / f"interview_{m.name}.wav"}
    sf.write(out["interview"], m.audio, RATE, subtype="PCM_16")
    for k, e in enumerate(m.enrolment):
        out[f"enrol{k}"] = folder / f"enrol_{k}.wav"
        sf.write(out[f"enrol{k}"], e, RATE, subtype="PCM_16")
    return out


@pytest.fixture(scope="session")
def mixtures(piper_sentences: list[dict[str, Any]]) -> dict[str, Mixture]:
    """The interview clean, with white noise at 20 dB, the music bed and the room (the
    conditions the tests assert on; the bench runs every condition)."""
    import soundfile as sf

    sentences = []
    for s in piper_sentences:
        audio, sr = sf.read(s["path"], dtype="float32")
        sentences.append((audio, sr, s["text"]))
    return build_mixtures(sentences, ("clean", "white20", "music15", "reverb"))


@pytest.fixture(scope="session")
def interview_voice(tmp_path_factory: pytest.TempPathFactory,
                    mixtures: dict[str, Mixture]) -> Path:
    """A voice holding the 20 dB interview as one imported take, prepared with no
    enrolment (the dominant speaker). Read-only: copy it (`copy_voice`) to change it."""
    from engine.layout.voice import create_voice
    from engine.prepare.importer import import_files
    from engine.prepare.pipeline import prepare

    tmp = tmp_path_factory.mktemp("interview")
    files = write_mixture(mixtures["white20"], tmp / "src")
    voice = create_voice(tmp / "voice", "Joe", "english")
    assert len(import_files(voice, [files["interview"]])["imported"]) == 1
    prepare(voice)
    return voice.path
