"""Decoding every format, rate and channel layout; loudness; voice activity and slicing."""

from __future__ import annotations

from math import gcd
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from engine.audio.io import TARGET_SR, BadAudioFile, decode, probe, write_wav
from engine.audio.loudness import (
    LoudnessMeter,
    integrated_loudness,
    k_weighting_sos,
    normalize_loudness,
)
from engine.audio.vad import plan_slices, snr_db, speech_regions
from engine.prepare.transcripts import group_sentences
from engine.text import split_sentences


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    g = gcd(src, dst)
    return resample_poly(x, dst // g, src // g).astype(np.float32)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Best normalised cross-correlation within +-50 ms (codecs add delay)."""
    n = min(len(a), len(b))
    a, b = a[:n] - a[:n].mean(), b[:n] - b[:n].mean()
    best = 0.0
    for lag in range(-1200, 1201, 4):
        x, y = (a[lag:], b[: n - lag]) if lag >= 0 else (a[: n + lag], b[-lag:])
        c = float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-12))
        best = max(best, c)
    return best


@pytest.fixture(scope="module")
def speech(piper_sentences: list[dict[str, Any]]) -> tuple[np.ndarray, int]:
    audio, sr = sf.read(piper_sentences[0]["path"], dtype="float32")
    return audio, sr


@pytest.mark.parametrize("fmt,ext", [("WAV", "wav"), ("FLAC", "flac"), ("OGG", "ogg"),
                                     ("MP3", "mp3")])
@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_decode_formats_and_rates(tmp_path: Path, speech: tuple[np.ndarray, int], fmt: str,
                                  ext: str, rate: int) -> None:
    audio, sr = speech
    src = _resample(audio, sr, rate)
    path = tmp_path / f"speech_{rate}.{ext}"
    sf.write(path, src, rate, format=fmt)
    info = probe(path)
    assert info.sample_rate == rate and info.channels == 1
    out, stats = decode(path)
    assert out.dtype == np.float32 and out.ndim == 1
    assert stats.source_rate == rate
    # the same duration at 24 kHz (MP3 adds up to a few frames of encoder delay)
    assert abs(len(out) / TARGET_SR - len(src) / rate) < 0.1
    # and the same sound: compare with the reference band-limited to the source rate
    ref = _resample(src, rate, TARGET_SR)
    assert _corr(out, ref) > (0.85 if fmt in ("OGG", "MP3") else 0.99)


def test_stereo_is_downmixed(tmp_path: Path, speech: tuple[np.ndarray, int]) -> None:
    audio, sr = speech
    # right channel in opposite polarity at half level: a plain mean keeps a quarter
    stereo = np.stack([audio, -0.5 * audio], axis=1)
    path = tmp_path / "stereo.flac"
    sf.write(path, stereo, sr)
    out, stats = decode(path)
    assert stats.channels == 2
    ref = _resample(0.25 * audio, sr, TARGET_SR)
    n = min(len(out), len(ref))
    assert np.max(np.abs(out[:n] - ref[:n])) < 0.02
    assert np.sqrt(np.mean(out ** 2)) == pytest.approx(np.sqrt(np.mean(ref ** 2)), rel=0.05)


def test_decode_streams_in_blocks_like_whole(tmp_path: Path, speech: tuple[np.ndarray, int]
                                             ) -> None:
    audio, sr = speech
    path = tmp_path / "s.wav"
    sf.write(path, audio, sr, subtype="FLOAT")
    whole, _ = decode(path, block_s=100.0)
    blocks, _ = decode(path, block_s=0.05)
    assert len(whole) == len(blocks)
    assert np.max(np.abs(whole - blocks)) < 1e-4


def test_clipping_counts_flat_runs_not_peaks(tmp_path: Path) -> None:
    sr = 16000
    t = np.arange(sr) / sr
    peaky = 0.5 * np.sin(2 * np.pi * 200 * t)
    peaky[100] = 1.0  # a lone full-scale sample (peak-normalised file)
    sf.write(tmp_path / "peak.wav", peaky, sr, subtype="FLOAT")
    clipped = np.clip(1.6 * np.sin(2 * np.pi * 200 * t), -1, 1)
    sf.write(tmp_path / "clip.wav", clipped, sr, subtype="FLOAT")
    assert decode(tmp_path / "peak.wav")[1].clipped == 0
    stats = decode(tmp_path / "clip.wav")[1]
    assert stats.clipped > 0.3 * sr
    assert stats.clipped_between(0.0, 0.5) == pytest.approx(stats.clipped / 2, rel=0.05)


def test_k_weighting_matches_bs1770_table() -> None:
    sos = k_weighting_sos(48000)
    # ITU-R BS.1770-4 tables 1 and 2 (48 kHz)
    assert sos[0] == pytest.approx([1.53512485958697, -2.69169618940638, 1.19839281085285,
                                    1.0, -1.69065929318241, 0.73248077421585], abs=1e-8)
    assert sos[1] == pytest.approx([1.0, -2.0, 1.0, 1.0, -1.99004745483398,
                                    0.99007225036621], abs=1e-8)


def test_integrated_loudness_reference_tone() -> None:
    # BS.1770: a 0 dBFS 997 Hz sine in one channel reads -3.01 LUFS
    sr = 48000
    t = np.arange(sr * 5) / sr
    assert integrated_loudness(np.sin(2 * np.pi * 997 * t), sr) == pytest.approx(-3.01, abs=0.02)
    # -20 dB of level is -20 LU
    assert integrated_loudness(0.1 * np.sin(2 * np.pi * 997 * t), sr) == pytest.approx(
        -23.01, abs=0.02)
    # gating: 5 s of silence do not count (ungated it would read -26); only the
    # three 400 ms blocks straddling the onset pull it down a little
    padded = np.concatenate([np.zeros(sr * 5), 0.1 * np.sin(2 * np.pi * 997 * t)])
    assert integrated_loudness(padded, sr) == pytest.approx(-23.01, abs=0.2)
    assert integrated_loudness(np.zeros(sr), sr) == float("-inf")


@pytest.mark.parity  # a sum in pieces vs pyloudnorm's whole sum, to a tolerance
@pytest.mark.parametrize("seconds", [0.2, 7.05, 60.0])
def test_the_streaming_meter_reads_what_the_whole_signal_reads(
        speech: tuple[np.ndarray, int], seconds: float) -> None:
    """A book is measured in pieces (`LoudnessMeter`, memory flat in its length): fed in
    pieces of any size it gives the whole-signal meter's loudness (pyloudnorm, with the
    short-signal rule) and the true peak of the whole signal upsampled to 192 kHz."""
    audio, sr = speech
    rng = np.random.default_rng(3)
    x = np.resize(audio, round(seconds * sr)).astype(np.float32)
    x[len(x) // 3:len(x) // 2] = 0.0  # gated-out silence inside
    meter = LoudnessMeter(sr)
    at = 0
    while at < len(x):
        size = int(rng.integers(1, 40_000))
        meter.push(x[at:at + size])
        at += size
    assert meter.loudness() == pytest.approx(integrated_loudness(x, sr), abs=1e-6)
    factor = round(192_000 / sr)
    whole = 20 * np.log10(np.max(np.abs(resample_poly(x.astype(np.float64), factor, 1))))
    assert meter.true_peak_dbtp() == pytest.approx(whole, abs=1e-6)
    assert meter.true_peak_dbtp() >= 20 * np.log10(np.max(np.abs(x)))


def test_normalize_hits_target_and_respects_ceiling(speech: tuple[np.ndarray, int]) -> None:
    audio, sr = speech
    x = _resample(audio, sr, TARGET_SR) * 0.05
    norm = normalize_loudness(x, TARGET_SR, target_lufs=-23.0, peak_dbfs=-1.0)
    assert integrated_loudness(norm.audio, TARGET_SR) == pytest.approx(-23.0, abs=0.1)
    assert np.max(np.abs(norm.audio)) <= 10 ** (-1 / 20) + 1e-6
    # a very loud target cannot be reached without clipping: the ceiling wins
    loud = normalize_loudness(x, TARGET_SR, target_lufs=-10.0, peak_dbfs=-1.0)
    assert loud.peak_limited
    assert np.max(np.abs(loud.audio)) == pytest.approx(10 ** (-1 / 20), rel=1e-3)
    assert integrated_loudness(loud.audio, TARGET_SR) == pytest.approx(loud.loudness_after,
                                                                       abs=0.05)
    assert loud.loudness_after < -12.0


def test_vad_finds_sentences_and_slices_at_longest_pauses(
        piper_sentences: list[dict[str, Any]]) -> None:
    parts, bounds, pos = [], [], 0
    for s in piper_sentences[:4]:
        a, sr = sf.read(s["path"], dtype="float32")
        a = _resample(a, sr, TARGET_SR)
        parts += [a, np.zeros(int(0.8 * TARGET_SR), np.float32)]
        # where the sound really starts and ends (piper pads each sentence with silence)
        loud = np.flatnonzero(np.abs(a) > 0.01)
        bounds.append((pos + loud[0], pos + loud[-1]))
        pos += len(a) + int(0.8 * TARGET_SR)
    x = np.concatenate(parts)
    regions = speech_regions(x, TARGET_SR)
    assert regions[0][0] <= bounds[0][0] + int(0.1 * TARGET_SR)
    slices = plan_slices(regions, len(x), TARGET_SR, min_s=1.0, max_s=5.0)
    assert len(slices) == 4  # each sentence is under 5 s; the 0.8 s gaps are the longest
    for sl, (a, b) in zip(slices, bounds, strict=True):
        # every slice holds its whole sentence, trimmed to ~0.15 s of silence each side
        assert sl.start <= a + int(0.05 * TARGET_SR) and sl.end >= b - int(0.05 * TARGET_SR)
        assert sl.start >= a - int(0.4 * TARGET_SR) and sl.end <= b + int(0.4 * TARGET_SR)
    # one long span without a limit breach stays whole
    assert len(plan_slices(regions, len(x), TARGET_SR, 1.0, 60.0)) == 1


def test_snr_estimate_tracks_added_noise(speech: tuple[np.ndarray, int]) -> None:
    audio, sr = speech
    x = _resample(audio, sr, TARGET_SR)
    x = np.concatenate([np.zeros(TARGET_SR // 2, np.float32), x,
                        np.zeros(TARGET_SR // 2, np.float32)])
    rng = np.random.default_rng(0)
    assert snr_db(x, TARGET_SR) > 50
    # the true ratio: clean speech power (over its own speech frames) to the noise power
    regions = speech_regions(x, TARGET_SR)
    speech_power = np.mean(np.concatenate([x[a:b] for a, b in regions]) ** 2)
    estimates = []
    for sigma in (0.01, 0.03, 0.1):
        true = 10 * np.log10(speech_power / sigma ** 2)
        est = snr_db(x + rng.normal(0, sigma, len(x)).astype(np.float32), TARGET_SR)
        assert abs(est - true) < 5, (sigma, est, true)
        estimates.append(est)
    assert estimates == sorted(estimates, reverse=True)


def test_silence_and_steady_noise_have_no_speech() -> None:
    rng = np.random.default_rng(1)
    assert speech_regions(np.zeros(TARGET_SR * 2, np.float32), TARGET_SR) == []
    noise = rng.normal(0, 0.1, TARGET_SR * 2).astype(np.float32)
    assert speech_regions(noise, TARGET_SR) == []


def test_sentence_split_and_grouping() -> None:
    text = "Dr. Smith arrived at noon. It rained! Did anyone bring an umbrella? No."
    assert split_sentences(text) == ["Dr. Smith arrived at noon.", "It rained!",
                                     "Did anyone bring an umbrella?", "No."]
    sentences = ["A short one.", "This sentence is quite a bit longer than the first.",
                 "Mid length sentence here."]
    # durations proportional to characters: one sentence per slice
    assert group_sentences(sentences, [1.0, 4.2, 2.1]) == sentences
    # two slices: the first two sentences share one
    assert group_sentences(sentences, [5.2, 2.1]) == [" ".join(sentences[:2]), sentences[2]]
    # lengths that fit no grouping are refused rather than guessed
    assert group_sentences(sentences, [6.0, 0.3]) is None
    assert group_sentences(sentences[:1], [1.0, 1.0]) is None


def test_write_wav_is_atomic_and_readable(tmp_path: Path) -> None:
    target = tmp_path / "a.wav"
    write_wav(target, np.zeros(100, np.float32), TARGET_SR)
    assert sf.info(target).samplerate == TARGET_SR
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"]  # no temp files left
    with pytest.raises(BadAudioFile):
        probe(tmp_path / "missing.wav")


def test_one_resampler_keeps_pitch_and_level_at_every_rate() -> None:
    from engine.audio.resample import resample

    for src, dst in ((48000, 24000), (44100, 24000), (22050, 24000), (24000, 16000)):
        t = np.arange(src) / src  # one second
        tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
        out = resample(tone, src, dst)
        assert out.dtype == np.float32 and abs(len(out) - dst) <= 1
        spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
        peak_hz = np.argmax(spectrum) * dst / len(out)
        assert abs(peak_hz - 440.0) <= 1.0, (src, dst, peak_hz)
        middle = out[dst // 4: 3 * dst // 4]  # away from the filter's edges
        assert abs(np.sqrt(np.mean(middle ** 2)) - 0.5 / np.sqrt(2)) < 0.01
    same = np.ones(10, np.float32)
    assert np.array_equal(resample(same, 24000, 24000), same)
    assert resample(np.zeros(0, np.float32), 48000, 24000).shape == (0,)
    stereo = np.zeros((4800, 2), np.float32)
    assert resample(stereo, 48000, 24000).shape == (2400, 2)
