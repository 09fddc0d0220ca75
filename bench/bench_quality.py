"""Quality benchmark: speech recognition speed and accuracy, speaker similarity on real
voices, and what evaluating one checkpoint costs.

    python bench/bench_quality.py [--sentences 8] [--width tiny,0.6b] [--layers 28]
                                  [--frames 40] [--train-step-s S] [--json FILE]

Prints:
- ASR, per backend: real-time factor (audio seconds per compute second) and word
  error rate on piper 'joe' sentences. pocketsphinx is the real thing; the Whisper
  rows use the tiny random Whisper (plumbing speed only: its words are random) unless
  a real Whisper is in the Hugging Face cache (then it is measured too);
- speaker similarity (resemblyzer): joe against joe, against joe pitch-shifted six
  semitones, and against espeak-ng (when installed);
- evaluation cost per checkpoint on the held-out sentences: a tiny-model run
  end to end (zero-shot, two checkpoints, export), and with --width 0.6b one
  checkpoint's render and measurement at the real 0.6B width (random weights, fixed
  frame count), beside the training step time of bench_train.py (--train-step-s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

def piper_clips(folder: Path, count: int) -> list[dict[str, Any]]:
    import numpy as np
    import soundfile as sf
    from piper import SynthesisConfig

    from tests.helpers.speech import SENTENCES, load_piper

    voice = load_piper()
    cfg = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    out = []
    for i, text in enumerate(SENTENCES[:count]):
        audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text, cfg)])
        path = folder / f"joe_{i:02d}.wav"
        sf.write(path, (0.7 * audio).astype("float32"), voice.config.sample_rate,
                 subtype="PCM_16")
        path.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
        out.append({"text": text, "path": path})
    return out


def bench_asr(clips: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    import numpy as np

    from engine.asr import recognizer as asr
    from engine.asr.tiny_whisper import convert_to_ctranslate2, make_tiny_whisper
    from engine.asr.wer import wer

    specs = [("pocketsphinx", "pocketsphinx", "real model, English")]
    tiny = make_tiny_whisper(work / "tiny-whisper")
    specs.append(("transformers", str(tiny), "tiny random Whisper: speed of the plumbing"))
    try:
        ct2 = convert_to_ctranslate2(tiny, work / "tiny-whisper-ct2")
        specs.append(("faster-whisper", str(ct2), "tiny random Whisper: speed of the plumbing"))
    except ImportError:
        print("  (faster-whisper / ctranslate2 not installed: no CTranslate2 row)")
    real = asr.find_whisper()
    if real:
        specs.append((asr.model_kind(Path(asr._cached(real) or "")) or "whisper", real,
                      "real Whisper from the cache"))
    audio = [asr.load_audio(c["path"]) for c in clips]
    rows = []
    for backend, spec, note in specs:
        t0 = time.perf_counter()
        rec = asr.load_recognizer(spec, "cpu")
        load_s = time.perf_counter() - t0
        rec.transcribe(audio[0][: asr.SAMPLE_RATE], "english")  # warm-up
        heard = [rec.transcribe(a, "english") for a in audio]
        total_audio = sum(h.duration_s for h in heard)
        total_compute = sum(h.compute_s for h in heard)
        rows.append({"backend": backend, "model": spec if backend == "pocketsphinx" else
                     Path(spec).name if "/" not in spec or Path(spec).exists() else spec,
                     "note": note, "load_s": round(load_s, 2),
                     "rtf": round(total_audio / total_compute, 2),
                     "wer": round(float(np.mean([wer(c["text"], h.text)
                                                 for c, h in zip(clips, heard, strict=True)])),
                                  3)})
    return rows


def bench_similarity(clips: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    import librosa
    import numpy as np
    import soundfile as sf

    from engine.quality.similarity import ResemblyzerEncoder, cosine

    enc = ResemblyzerEncoder()
    waves = [sf.read(c["path"], dtype="float32") for c in clips[:6]]
    joe = [enc.embed(a, sr) for a, sr in waves]
    same = [cosine(a, b) for a, b in combinations(joe, 2)]
    shifted = [enc.embed(librosa.effects.pitch_shift(a, sr=sr, n_steps=6), sr)
               for a, sr in waves]
    out: dict[str, Any] = {
        "same_mean": float(np.mean(same)), "same_min": float(np.min(same)),
        "pitch_mean": float(np.mean([cosine(a, b) for a in joe for b in shifted])),
        "pitch_max": float(np.max([cosine(a, b) for a in joe for b in shifted])),
    }
    if shutil.which("espeak-ng"):
        other = []
        for i, c in enumerate(clips[:6]):
            path = work / f"espeak_{i}.wav"
            subprocess.run(["espeak-ng", "-w", str(path), c["text"]], check=True)
            other.append(enc.embed(*sf.read(path, dtype="float32")))
        scores = [cosine(a, b) for a in joe for b in other]
        out.update(espeak_mean=float(np.mean(scores)), espeak_max=float(np.max(scores)))
    return out


def tiny_run(clips: list[dict[str, Any]], work: Path) -> Path:
    """A prepared piper voice with a tiny-model run of two checkpoints and an export."""
    from engine.layout.voice import create_voice
    from engine.model.tiny import make_tiny_model
    from engine.prepare.importer import import_files
    from engine.prepare.pipeline import prepare
    from tests.helpers.runs import make_perturbed_run

    model = make_tiny_model(work / "tiny-base")
    voice = create_voice(work / "joe", "Joe")
    import_files(voice, [c["path"] for c in clips])
    prepare(voice)
    make_perturbed_run(voice.path, model, run="bench")
    return voice.path


def bench_eval_tiny(voice: Path, sentences: int) -> list[dict[str, Any]]:
    from engine.quality.evaluate import HELD_OUT_SENTENCES, EvaluateRequest, evaluate

    result = evaluate(EvaluateRequest(voice, checkpoints="all", asr="pocketsphinx",
                                      sentences=HELD_OUT_SENTENCES[:sentences], device="cpu",
                                      force=True))
    return [{"voice": e["label"], "render_s": e["render_s"], "measure_s": e["measure_s"],
             "total_s": round(e["render_s"] + e["measure_s"], 2),
             "similarity": e["mean"]["similarity"], "wer": e["mean"]["wer"]}
            for e in result["entries"]]


def bench_eval_width(voice: Path, work: Path, layers: int, frames: int,
                     sentences: int) -> dict[str, Any]:
    """One checkpoint's evaluation at the real 0.6B width: render (fixed frames) + measure."""
    from bench.bench_train import make_model_dir
    from engine.config.speak import SpeakOptions
    from engine.layout.manifest import reference_clip
    from engine.layout.voice import open_voice
    from engine.quality.evaluate import HELD_OUT_SENTENCES, pick_run
    from engine.quality.measure import Meter
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    base = make_model_dir(work / "base-0.6b", layers)
    # bench_train's folder holds the talker only: the codec and tokenizer come from the tiny
    # model it was made from (the codec's cost is the tiny one's, as in bench_synth)
    for item in (work / "tiny-template").iterdir():
        if not (base / item.name).exists():
            (shutil.copytree if item.is_dir() else shutil.copy)(item, base / item.name)
    v = open_voice(voice)
    texts = HELD_OUT_SENTENCES[:sentences]
    source = resolve_source(str(base), reference=reference_clip(voice))
    t0 = time.perf_counter()
    synth = Synthesizer.load(source, device="cpu")
    load_s = time.perf_counter() - t0
    opts = SpeakOptions(max_frames=frames, seed=0, loudness_lufs=None, do_sample=False,
                        subtalker_do_sample=False)
    t0 = time.perf_counter()
    speeches = synth.speak_many(texts, opts)
    render_s = time.perf_counter() - t0
    from engine.core.events import Emitter

    # random talker weights only: no speaker encoder, so the independent encoder alone
    meter = Meter("pocketsphinx", None, "cpu", Emitter())
    ref = meter.reference(v, pick_run(v, None), 8)
    t0 = time.perf_counter()
    for text, s in zip(texts, speeches, strict=True):
        meter.measure(s.audio, s.sample_rate, text, ref, "english")
    measure_s = time.perf_counter() - t0
    return {"layers": layers, "frames": frames, "sentences": len(texts),
            "load_s": round(load_s, 2), "render_s": round(render_s, 2),
            "measure_s": round(measure_s, 2), "total_s": round(render_s + measure_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=8, help="held-out sentences")
    parser.add_argument("--width", default="tiny", help="tiny and/or 0.6b (comma-separated)")
    parser.add_argument("--layers", type=int, default=28, help="0.6B talker layers")
    parser.add_argument("--frames", type=int, default=40,
                        help="codec frames per sentence at 0.6B width (12.5 per second)")
    parser.add_argument("--train-step-s", type=float, default=None,
                        help="step time printed by bench_train.py, shown beside")
    parser.add_argument("--parts", default="asr,similarity,eval",
                        help="what to measure (comma-separated: asr, similarity, eval)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    widths = {w.strip() for w in args.width.split(",") if w.strip()}
    work = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    figures: dict[str, Any] = {}
    try:
        clips = piper_clips(work, 12)
        if "asr" in parts:
            print(f"ASR on {args.sentences} piper 'joe' sentences (CPU, "
                  f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}):", flush=True)
            figures["asr"] = bench_asr(clips[: args.sentences], work)
            print(f"  {'backend':<15}{'RTF':>8}{'WER':>8}{'load s':>8}  model")
            for r in figures["asr"]:
                print(f"  {r['backend']:<15}{r['rtf']:>8.2f}{r['wer']:>8.3f}"
                      f"{r['load_s']:>8.2f}  {r['model']} ({r['note']})", flush=True)
        if "similarity" in parts:
            sim = figures["similarity"] = bench_similarity(clips, work)
            print("Speaker similarity (resemblyzer cosine), 6 joe clips:")
            print(f"  joe vs joe           mean {sim['same_mean']:.3f}  "
                  f"min {sim['same_min']:.3f}")
            print(f"  joe vs joe +6 st     mean {sim['pitch_mean']:.3f}  "
                  f"max {sim['pitch_max']:.3f}")
            if "espeak_mean" in sim:
                print(f"  joe vs espeak-ng     mean {sim['espeak_mean']:.3f}  "
                      f"max {sim['espeak_max']:.3f}", flush=True)
        if "eval" in parts:
            voice = tiny_run(clips, work)
            if "tiny" in widths:
                rows = figures["eval_tiny"] = bench_eval_tiny(voice, args.sentences)
                print(f"Evaluation per voice, tiny model, {args.sentences} held-out "
                      "sentences (render, then recognise + embed + levels):")
                for r in rows:
                    print(f"  {r['voice']:<12} render {r['render_s']:6.2f} s  measure "
                          f"{r['measure_s']:6.2f} s  total {r['total_s']:6.2f} s", flush=True)
            if "0.6b" in widths:
                w = figures["eval_0.6b"] = bench_eval_width(voice, work, args.layers,
                                                            args.frames, args.sentences)
                print(f"Evaluation of one checkpoint at 0.6B width ({w['layers']} layers, "
                      f"{w['sentences']} sentences x {w['frames']} frames, random weights):")
                print(f"  render {w['render_s']:.1f} s + measure {w['measure_s']:.1f} s = "
                      f"{w['total_s']:.1f} s (model load {w['load_s']:.1f} s, once per run)")
                if args.train_step_s:
                    print(f"  = {w['total_s'] / args.train_step_s:.1f} training steps of "
                          f"{args.train_step_s:.2f} s (bench_train.py, 0.6B width)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
