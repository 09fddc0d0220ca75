"""Who is speaking: keep the voice's own speaker, leave out the others and the overlaps.

A recording made outside a studio (an interview, a podcast, a video) holds
more than one voice. Prepare keeps only the target speaker:

1. Speaker embeddings (resemblyzer d-vectors, the encoder whose weights ship in
   its wheel, or the Qwen3-TTS Base model's own x-vector encoder when a model is
   named) of short windows (1 s, every 0.25 s) over the detected speech.
2. The target: the centroid of an enrolment (the voice's own recorded takes,
   or a clip the user names with --speaker-reference), or, without one, the
   dominant speaker: the larger of two clusters of the windows (the speaker
   with the most speech), which the report says.
3. Every 10 ms of speech gets the mean of (similarity to the target minus
   similarity to the other speaker) over the windows covering it. Clearly
   positive is the target, clearly negative another speaker, in between is
   two voices at once or a voice like neither: excluded as overlap.
4. Speech regions are cut where the speaker changes, so a turn of the target
   is kept even when the other speaker starts before it has ended. A change
   with no pause between (the VAD heard one stretch, the embeddings two
   voices) is people talking over each other: CHANGE_GUARD_S either side of
   it is overlap.

The thresholds were set on piper speech and the same voice 6 semitones up
(tests/helpers/mixtures.py); bench/bench_prepare.py --mixtures prints what
they give under noise, music and echo.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.resample import resample
from engine.audio.timebase import SAMPLE_RATE
from engine.model.speaker_encoder import (
    at_model_rate,
    load_speaker_encoder,
    speaker_encoder_fingerprint,
    x_vectors,
)

#: resemblyzer's rate and mel frame step (10 ms)
RATE = 16000
FRAME = 160
WINDOW_FRAMES = 100  # 1 s: long enough for a d-vector, short enough to follow a turn
HOP_FRAMES = 25
#: clusters this similar are one speaker (same voice, different sentences: ~0.9)
SAME_SPEAKER = 0.8
#: one speaker in a take whose centroid is below this against the enrolment is not the target;
#: measured per interview turn against two clean takes: the target 0.67-0.95 (clean to
#: white noise at 5 dB, pink, music, room), the other voice 0.46-0.59
ENROL_MIN = 0.63
#: the smaller of two speaker clusters needs this many windows (~2 s) and this share
MIN_CLUSTER_WINDOWS = 8
MIN_CLUSTER_SHARE = 0.2
#: |target - other| under this margin: neither speaker clearly (overlap)
MARGIN = 0.06
#: speaker runs shorter than this are absorbed by their neighbours (a window's jitter)
MIN_RUN_S = 0.3
#: around a speaker change with no pause, this much each side is taken as overlap: a
#: 1 s window places the change within ~0.5 s of where the second voice starts
CHANGE_GUARD_S = 0.5

TARGET, OTHER, OVERLAP = "target", "another speaker", "overlap"

_encoder: Any = None
_lock = threading.Lock()


def _voice_encoder() -> Any:
    global _encoder
    with _lock:
        if _encoder is None:
            from resemblyzer import VoiceEncoder  # noqa: PLC0415

            _encoder = VoiceEncoder(device="cpu", verbose=False)
        return _encoder


def _unit_rows(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def to_16k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    return resample(audio, sample_rate, RATE)


def _mels(audio16: np.ndarray) -> np.ndarray:
    from resemblyzer.audio import normalize_volume, wav_to_mel_spectrogram  # noqa: PLC0415
    from resemblyzer.hparams import audio_norm_target_dBFS  # noqa: PLC0415

    if _silent(audio16):
        # resemblyzer's volume rule divides by the level: silence would become NaN
        return wav_to_mel_spectrogram(np.zeros_like(audio16, dtype=np.float32))
    wav = normalize_volume(audio16, audio_norm_target_dBFS, increase_only=True)
    return wav_to_mel_spectrogram(wav.astype(np.float32))


def _silent(audio: np.ndarray) -> bool:
    """No usable signal: digital silence (below -80 dBFS RMS) or not finite."""
    if audio.size == 0 or not np.isfinite(audio).all():
        return True
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) < 1e-4


class Resemblyzer:
    """resemblyzer's d-vector encoder (weights in its wheel): the default."""

    name = "resemblyzer"
    key = "resemblyzer"
    dim = 256

    def features(self, audio: np.ndarray, sample_rate: int) -> tuple[np.ndarray, int]:
        """What `embed` slices windows from, and its length in 10 ms frames."""
        mels = _mels(to_16k(audio, sample_rate))
        return mels, len(mels)

    def embed(self, feats: np.ndarray, starts: list[int]) -> np.ndarray:
        import torch  # noqa: PLC0415

        enc = _voice_encoder()
        if len(feats) < WINDOW_FRAMES:
            feats = np.pad(feats, ((0, WINDOW_FRAMES - len(feats)), (0, 0)))
        batch = np.stack([feats[s:s + WINDOW_FRAMES] for s in starts]).astype(np.float32)
        with _lock, torch.inference_mode():
            out = enc(torch.from_numpy(batch)).cpu().numpy()
        return _unit_rows(out.astype(np.float64))


class ModelEncoder:
    """The Qwen3-TTS Base model's own speaker encoder (the ECAPA-TDNN that makes a run's
    x-vector, 24 kHz, 128-bin mel), on the same 1 s windows as resemblyzer.

    The thresholds above were measured with resemblyzer; they are used unchanged here
    (no released checkpoint was at hand to measure this encoder's own)."""

    name = "model"
    MODEL_RATE = SAMPLE_RATE
    #: windows per forward pass (a 1 s window is 94 mel frames)
    BATCH = 64

    def __init__(self, model_dir: str | Path) -> None:
        self._encoder = load_speaker_encoder(model_dir, "cpu")
        self.key = "model:" + speaker_encoder_fingerprint(model_dir)[:16]
        self._lock = threading.Lock()
        self.dim = int(self._forward(np.zeros((1, self.MODEL_RATE), np.float32)).shape[1])

    def _forward(self, batch: np.ndarray) -> np.ndarray:
        with self._lock:
            return x_vectors(self._encoder, batch)

    def features(self, audio: np.ndarray, sample_rate: int) -> tuple[np.ndarray, int]:
        x = at_model_rate(np.nan_to_num(np.asarray(audio, dtype=np.float32)), sample_rate)
        return x, len(x) * RATE // (self.MODEL_RATE * FRAME)

    def embed(self, feats: np.ndarray, starts: list[int]) -> np.ndarray:
        step = self.MODEL_RATE * FRAME // RATE  # samples per 10 ms frame
        width = WINDOW_FRAMES * step
        rows = []
        for s in starts:
            w = feats[s * step:s * step + width]
            rows.append(np.pad(w, (0, width - len(w))))
        out = [self._forward(np.stack(rows[i:i + self.BATCH]))
               for i in range(0, len(rows), self.BATCH)]
        return _unit_rows(np.concatenate(out).astype(np.float64))


#: the encoder used where none is named
RESEMBLYZER = Resemblyzer()
ENCODERS = ("resemblyzer", "model")


def embed_clip(audio: np.ndarray, sample_rate: int, encoder: Any = None) -> np.ndarray:
    """One unit embedding for a whole clip (mean of its 1 s windows)."""
    enc = encoder or RESEMBLYZER
    feats, n = enc.features(audio, sample_rate)
    starts = list(range(0, max(1, n - WINDOW_FRAMES + 1), HOP_FRAMES))
    return _unit_rows(enc.embed(feats, starts).mean(axis=0))


@dataclass
class Windows:
    centers: np.ndarray  # 10 ms frame index of each window's middle
    starts: np.ndarray  # first frame of each window
    emb: np.ndarray  # (n, 256) unit rows
    n_frames: int


def speech_windows(audio: np.ndarray, sample_rate: int,
                   regions: list[tuple[int, int]], encoder: Any = None) -> Windows:
    """Embeddings of 1 s windows over the speech regions (sample ranges at `sample_rate`)."""
    enc = encoder or RESEMBLYZER
    feats, n = enc.features(audio, sample_rate)
    starts: list[int] = []
    for a, b in regions:
        fa, fb = int(a * RATE / sample_rate) // FRAME, int(b * RATE / sample_rate) // FRAME
        if fb - fa <= WINDOW_FRAMES:
            mid = (fa + fb) // 2
            starts.append(min(max(0, mid - WINDOW_FRAMES // 2), max(0, n - WINDOW_FRAMES)))
        else:
            starts += list(range(fa, fb - WINDOW_FRAMES + 1, HOP_FRAMES))
            if starts[-1] != fb - WINDOW_FRAMES:
                starts.append(fb - WINDOW_FRAMES)
    if not starts:
        return Windows(np.zeros(0, int), np.zeros(0, int), np.zeros((0, enc.dim)), n)
    emb = enc.embed(feats, starts)
    s = np.asarray(starts)
    return Windows(s + WINDOW_FRAMES // 2, s, emb, n)


def _two_means(emb: np.ndarray, init: tuple[np.ndarray, np.ndarray] | None = None,
               iters: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two cosine clusters: (centroid 0, centroid 1, label per row); a deterministic start
    from `init`, else from the overall mean and the row least like it."""
    if init is None:
        mean = _unit_rows(emb.mean(axis=0))
        c = np.stack([mean, emb[int(np.argmin(emb @ mean))]])
    else:
        c = np.stack(init)
    labels = np.zeros(len(emb), dtype=int)
    for _ in range(iters):
        labels = np.argmax(emb @ c.T, axis=1)
        new = np.stack([_unit_rows(emb[labels == k].mean(axis=0)) if (labels == k).any()
                        else c[k] for k in range(2)])
        if np.allclose(new, c):
            break
        c = new
    return c[0], c[1], labels


@dataclass
class Speakers:
    target: np.ndarray
    other: np.ndarray | None
    #: "enrolment" (the voice's takes or a named clip) or "dominant" (the most speech)
    source: str
    #: how many speakers were told apart (1 or 2)
    count: int
    #: with one speaker: the enrolment's similarity to it decides all its speech
    whole: str = TARGET

    def scores(self, emb: np.ndarray) -> np.ndarray:
        """Positive: the target; negative: the other speaker; near 0: neither clearly."""
        if self.other is None:
            return np.full(len(emb), 1.0 if self.whole == TARGET else -1.0)
        return emb @ self.target - emb @ self.other


def _apart(c0: np.ndarray, c1: np.ndarray, labels: np.ndarray) -> bool:
    """Two speakers, not one speaker's sentences split by what was said: the
    centroids differ and the smaller cluster holds a real share of the speech
    (one voice's 1 s windows split 3-7 of 46 on the mixtures, two voices 35-51 of 90)."""
    small = int(min(np.sum(labels == 0), np.sum(labels == 1)))
    return (float(c0 @ c1) < SAME_SPEAKER and small >= MIN_CLUSTER_WINDOWS
            and small >= MIN_CLUSTER_SHARE * len(labels))


def find_speakers(windows: Windows, enrolment: np.ndarray | None) -> Speakers:
    emb = windows.emb
    source = "dominant" if enrolment is None else "enrolment"
    if not len(emb):
        return Speakers(np.zeros(emb.shape[1]), None, source, 0)
    mean = _unit_rows(emb.mean(axis=0))
    if enrolment is None:
        c0, c1, labels = _two_means(emb)
    else:
        # the enrolment was recorded elsewhere (another room, microphone, noise): the
        # clusters are refined on this recording, started from the enrolment and the
        # window least like it; the target is the cluster nearer the enrolment
        enrol = _unit_rows(np.asarray(enrolment, dtype=np.float64))
        c0, c1, labels = _two_means(emb, (enrol, emb[int(np.argmin(emb @ enrol))]))
    if not _apart(c0, c1, labels):
        if enrolment is None:
            return Speakers(mean, None, source, 1)
        # similarity is reported against the enrolment, which decides the whole take
        enrol = _unit_rows(np.asarray(enrolment, dtype=np.float64))
        return Speakers(enrol, None, source, 1, TARGET if float(mean @ enrol) >= ENROL_MIN
                        else OTHER)
    if enrolment is None:
        first = int(np.sum(labels == 1) > np.sum(labels == 0))
        target, other = (c1, c0) if first else (c0, c1)
    else:
        near = float(c1 @ enrolment) > float(c0 @ enrolment)
        target, other = (c1, c0) if near else (c0, c1)
    return Speakers(target, other, source, 2)


@dataclass(frozen=True)
class Segment:
    start: int  # samples at the take's rate
    end: int
    who: str  # TARGET, OTHER or OVERLAP


def _label(score: float) -> str:
    if score > MARGIN:
        return TARGET
    if score < -MARGIN:
        return OTHER
    return OVERLAP


def segments(regions: list[tuple[int, int]], sample_rate: int, windows: Windows,
             speakers: Speakers) -> list[Segment]:
    """The speech regions cut where the speaker changes, each part labelled."""
    if not len(windows.emb):
        return [Segment(a, b, TARGET) for a, b in regions]
    score = speakers.scores(windows.emb)
    total = np.zeros(windows.n_frames + WINDOW_FRAMES)
    count = np.zeros_like(total)
    # each window speaks for its middle half (its edges also hear the neighbours)
    q = WINDOW_FRAMES // 4
    for s, v in zip(windows.starts, score, strict=True):
        total[s + q:s + WINDOW_FRAMES - q] += v
        count[s + q:s + WINDOW_FRAMES - q] += 1
    per = sample_rate * FRAME / RATE  # samples per 10 ms frame
    out: list[Segment] = []
    min_run = int(MIN_RUN_S * RATE / FRAME)
    for a, b in regions:
        fa, fb = int(a / per), max(int(a / per) + 1, int(b / per))
        c = count[fa:fb]
        if not c.any():  # short region: its single window covers it
            near = int(np.argmin(np.abs(windows.centers - (fa + fb) // 2)))
            out.append(Segment(a, b, _label(float(score[near]))))
            continue
        # frames no window's middle reached take their nearest covered neighbour
        idx = np.flatnonzero(c)
        val = total[fa:fb][idx] / c[idx]
        frame_scores = np.interp(np.arange(fb - fa), idx, val)
        labels = [_label(float(v)) for v in frame_scores]
        runs: list[list[Any]] = []
        for i, lab in enumerate(labels):
            if runs and runs[-1][2] == lab:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1, lab])
        # absorb short runs into the longer neighbour, repeatedly
        changed = True
        while changed and len(runs) > 1:
            changed = False
            k = min(range(len(runs)), key=lambda j: runs[j][1] - runs[j][0])
            if runs[k][1] - runs[k][0] < min_run:
                left = runs[k - 1] if k > 0 else None
                right = runs[k + 1] if k + 1 < len(runs) else None
                nb = max((r for r in (left, right) if r is not None),
                         key=lambda r: r[1] - r[0])
                nb[0], nb[1] = min(nb[0], runs[k][0]), max(nb[1], runs[k][1])
                del runs[k]
                merged: list[list[Any]] = []
                for r in runs:
                    if merged and merged[-1][2] == r[2]:
                        merged[-1][1] = r[1]
                    else:
                        merged.append(r)
                runs = merged
                changed = True
        parts = [[a if i0 == 0 else int((fa + i0) * per),
                  b if i1 == fb - fa else int((fa + i1) * per), lab] for i0, i1, lab in runs]
        out += _guard_changes(parts, int(CHANGE_GUARD_S * sample_rate))
    return out


def _guard_changes(parts: list[list[Any]], guard: int) -> list[Segment]:
    """Where the speaker changes with no pause (the VAD heard one stretch, the embedding
    two voices), people talk over each other: the stretch around the change is overlap."""
    out: list[list[Any]] = [list(p) for p in parts]
    k = 0
    while k + 1 < len(out):
        left, right = out[k], out[k + 1]
        if {left[2], right[2]} == {TARGET, OTHER}:
            x = left[1]
            zone = [max(left[0], x - guard), min(right[1], x + guard), OVERLAP]
            left[1], right[0] = zone[0], zone[1]
            out.insert(k + 1, zone)
        k += 1
    return [Segment(int(s0), int(s1), lab) for s0, s1, lab in out if s1 > s0]


def similarity_in(windows: Windows, speakers: Speakers, start: int, end: int,
                  sample_rate: int) -> tuple[float | None, float | None]:
    """Similarity to the target (and to the other speaker) of the speech in
    [start, end): the mean embedding of the windows centred inside it."""
    if not len(windows.emb):
        return None, None
    centers = windows.centers * FRAME * sample_rate / RATE
    inside = (centers >= start) & (centers < end)
    if not inside.any():
        inside = np.zeros(len(centers), dtype=bool)
        inside[int(np.argmin(np.abs(centers - (start + end) / 2)))] = True
    mean = _unit_rows(windows.emb[inside].mean(axis=0))
    other = None if speakers.other is None else round(float(mean @ speakers.other), 3)
    return round(float(mean @ speakers.target), 3), other


def enrolment_embedding(clips: list[tuple[np.ndarray, int]],
                        encoder: Any = None) -> np.ndarray | None:
    """The target's centroid from clean clips of the voice (None when there are none)."""
    # a silent or broken take says nothing about the speaker
    embs = [embed_clip(a, sr, encoder) for a, sr in clips
            if len(a) >= sr // 2 and not _silent(a)]
    if not embs:
        return None
    return _unit_rows(np.mean(embs, axis=0))
