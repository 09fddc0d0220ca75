"""Evaluate a run: is the clone getting better, and does it still say the words?

`evaluate(voice, run, checkpoints)` renders a fixed set of held-out sentences
with one seed from
- the zero-shot clone (the base model with the voice's reference clip: the
  strongest zero-shot mode the synthesis supports; the report says which),
- each chosen checkpoint of the run,
- the voice's latest export,
and measures every render:
- speaker similarity to the speaker's held-out clips (the run's validation
  clips, never trained on), with resemblyzer (independent of the model) and
  with the base model's own speaker encoder (reported beside it, never alone);
- intelligibility: word error rate of the recogniser's transcript against the
  sentence (normalised text);
- speaking rate in words per second of speech, against the speaker's own;
- loudness (LUFS), peak and clipped samples, and whether a sentence hit its
  length cap (the model never ended it).

Everything lands in `<voice>/runs/<run>/evaluation/`: `evaluation.json`,
`report.html` (players, table, plots) and `renders/<voice>/NN.wav`. A render
already measured with the same sentences, seed, options and recogniser is
reused, so evaluating again after more checkpoints costs only the new ones.

Best checkpoint: the highest independent similarity among the checkpoints
whose word error rate is within `WER_SLACK` of the lowest checkpoint WER
(a voice that sounds right but mumbles is not the best).
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.atomic import write_json, write_text
from engine.core.errors import Cancelled, InputError, VoxshardError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.voice import Voice, display_path, now_iso, open_voice, slug

#: sentences no prompt set or test clip contains (held out from any training data)
HELD_OUT_SENTENCES = [
    "A gentle breeze carried the smell of rain across the open field.",
    "Please call me back when you have a free moment this afternoon.",
    "The library opens at nine and closes early on Sundays.",
    "We watched the boats drift slowly into the quiet harbor.",
    "My brother baked a chocolate cake for the whole family.",
    "Turn left at the bakery, then walk straight for two blocks.",
    "Nobody expected the old clock to start ticking again.",
    "Bright lanterns lit the narrow street during the winter festival.",
]
EVAL_DIR = "evaluation"
FORMAT = 1
#: held-out reference clips used at most (each costs two embeddings)
MAX_REFERENCES = 8
#: a checkpoint within this much WER of the best checkpoint WER may be "best"
WER_SLACK = 0.10
#: speaking rate outside this ratio of the speaker's own is reported as drift
RATE_BAND = (0.8, 1.25)
#: a similarity this much below the zero-shot clone is reported
SIMILARITY_DROP = 0.02
#: loudness floor reported for silence (integrated loudness of silence is -inf)
LOUDNESS_FLOOR = -70.0
PEAK_FLOOR = -100.0
CLIP_LEVEL = 0.999


@dataclass
class Reference:
    """The speaker's held-out clips and what they measure."""

    clips: list[dict[str, Any]]
    held_out: bool
    words_per_s: float | None
    centroid: dict[str, np.ndarray]
    self_similarity: dict[str, float | None]

    def to_dict(self, out_dir: Path) -> dict[str, Any]:
        return {"clips": [{"id": c["id"], "text": c.get("text", ""),
                           "path": _rel(Path(c["abs"]), out_dir)} for c in self.clips],
                "held_out": self.held_out,
                "words_per_s": _r(self.words_per_s),
                "self_similarity": {k: _r(v) for k, v in self.self_similarity.items()}}


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _rel(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:  # another drive (Windows)
        return str(path)


# -- what to evaluate --------------------------------------------------------------------------

def _runs_with_checkpoints(voice: Voice) -> list[Path]:
    from engine.synth.voice import list_run_checkpoints

    if not voice.runs_dir.is_dir():
        return []
    return [r for r in voice.runs_dir.iterdir() if r.is_dir() and list_run_checkpoints(r)]


def pick_run(voice: Voice, run: str | None, need_checkpoint: bool = True) -> Path:
    """The named run (name or path), else the run whose newest checkpoint is newest.
    `need_checkpoint=False` accepts a run that has none yet (the zero-shot baseline)."""
    from engine.synth.voice import list_run_checkpoints

    if run:
        path = Path(run).expanduser()
        run_dir = path if path.is_dir() and path.parent.name == "runs" else voice.runs_dir / run
        if not run_dir.is_dir():
            names = sorted(p.name for p in voice.runs_dir.iterdir() if p.is_dir()) \
                if voice.runs_dir.is_dir() else []
            raise InputError(f"The voice {voice.path.name} has no run {run!r}.",
                             f"Its runs: {', '.join(names)}." if names
                             else "Train the voice first.")
    else:
        found = _runs_with_checkpoints(voice)
        if found:
            return max(found, key=lambda r: list_run_checkpoints(r)[-1].stat().st_mtime)
        runs = [p for p in voice.runs_dir.iterdir() if p.is_dir()] \
            if voice.runs_dir.is_dir() else []
        if not runs:
            raise WorkspaceError(f"The voice {voice.path.name} has no training run yet, so "
                                 "there is nothing to evaluate.",
                                 "Train it first with `voxshard-engine train`.")
        run_dir = max(runs, key=lambda p: p.stat().st_mtime)
    if need_checkpoint and not list_run_checkpoints(run_dir):
        raise WorkspaceError(f"The run {run_dir.name} has no complete checkpoint yet, so "
                             "there is nothing to evaluate.",
                             "Train longer (a checkpoint is written every few hundred steps), "
                             "or pick another run with --run.")
    return run_dir


def _previous(out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / "evaluation.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _best_by_validation(run_dir: Path) -> int | None:
    """Step of the lowest validation loss in metrics.jsonl (when it has one)."""
    best: tuple[float, int] | None = None
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        values = rec.get("values", rec) if isinstance(rec, dict) else {}
        loss, step = values.get("loss/val"), values.get("step")
        if isinstance(loss, int | float) and isinstance(step, int) and math.isfinite(loss):
            if best is None or loss < best[0]:
                best = (float(loss), step)
    return None if best is None else best[1]


def pick_checkpoints(run_dir: Path, which: str | list[str] | None, out_dir: Path,
                     emitter: Emitter, missing: list[dict[str, Any]] | None = None
                     ) -> list[Path]:
    """`all`, `latest`, `best` (the last evaluation's best, else the lowest validation
    loss, else the latest), or steps/names ("100,200"); an empty list picks none.
    With `missing` (a list), a named checkpoint that is gone (training pruned it) is
    appended there instead of failing."""
    from engine.synth.voice import checkpoint_step, list_run_checkpoints, pick_checkpoint

    found = list_run_checkpoints(run_dir)
    if isinstance(which, list):
        if not which:
            return []
        wanted = which
    else:
        wanted = [w.strip() for w in str(which or "all").split(",") if w.strip()]
    if wanted in (["all"], []):
        return found
    if wanted == ["latest"]:
        return found[-1:]
    if wanted == ["best"]:
        steps = {checkpoint_step(c): c for c in found}
        prev = _previous(out_dir)
        best = (prev or {}).get("best") or {}
        if best.get("step") in steps:
            emitter.log(f"Best checkpoint of the last evaluation: step {best['step']}.")
            return [steps[best["step"]]]
        val = _best_by_validation(run_dir)
        if val in steps:
            emitter.log(f"No evaluation yet; step {val} has the lowest validation loss.")
            return [steps[val]]
        emitter.log("No evaluation and no validation loss yet; using the latest checkpoint.",
                    level="warning")
        return found[-1:]
    picked: list[Path] = []
    for w in wanted:
        try:
            picked.append(pick_checkpoint(run_dir, w))
        except VoxshardError:
            if missing is None:
                raise
            name = Path(str(w)).name
            step = checkpoint_step(Path(name)) if not name.isdigit() else int(name)
            missing.append(_skip_note(step, name))
    return sorted(dict.fromkeys(picked), key=lambda p: checkpoint_step(p) or 0)


def _skip_note(step: int | None, name: str) -> dict[str, Any]:
    return {"step": step, "checkpoint": name,
            "reason": "training deleted it (keeping only its newest checkpoints) before "
                      "it was measured"}


def _latest_export(voice: Voice) -> Path | None:
    if not voice.exports_dir.is_dir():
        return None
    found = [p for p in voice.exports_dir.iterdir() if (p / "config.json").is_file()]
    return max(found, key=lambda p: (p / "config.json").stat().st_mtime, default=None)


def _run_config(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


# -- measuring ------------------------------------------------------------------------------------

def speech_span_s(audio: np.ndarray, sample_rate: int) -> float:
    """Seconds from the first to the last speech region (pauses inside count, silence around
    does not); the whole length when no region is found."""
    from engine.audio.vad import speech_regions

    if audio.size == 0:
        return 0.0
    try:
        regions = speech_regions(np.asarray(audio, dtype=np.float32), sample_rate)
    except (ValueError, IndexError):
        regions = []
    if not regions:
        return len(audio) / sample_rate
    return (regions[-1][1] - regions[0][0]) / sample_rate


def level_figures(audio: np.ndarray, sample_rate: int) -> dict[str, float]:
    """Integrated loudness (LUFS, floored), peak (dBFS, floored), clipped sample fraction."""
    from engine.audio.loudness import integrated_loudness

    audio = np.nan_to_num(np.asarray(audio, dtype=np.float32))
    try:
        lufs = float(integrated_loudness(audio, sample_rate)) if audio.size else -math.inf
    except (ValueError, ZeroDivisionError):
        lufs = -math.inf
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    return {
        "loudness_lufs": round(max(LOUDNESS_FLOOR, lufs) if math.isfinite(lufs)
                               else LOUDNESS_FLOOR, 2),
        "peak_dbfs": round(max(PEAK_FLOOR, 20 * math.log10(peak)) if peak > 0 else PEAK_FLOOR,
                           2),
        "clipped_fraction": round(float(np.mean(np.abs(audio) >= CLIP_LEVEL)) if audio.size
                                  else 0.0, 6),
    }


class Meter:
    """The recogniser and both speaker encoders, loaded once, measuring renders."""

    def __init__(self, asr: Any, base_model: Path | None, device: str | None,
                 emitter: Emitter) -> None:
        from engine.asr.recognizer import load_recognizer
        from engine.quality.similarity import ModelSpeakerEncoder, ResemblyzerEncoder

        self.asr = asr if hasattr(asr, "transcribe") else load_recognizer(asr, device)
        self.encoders: dict[str, Any] = {"resemblyzer": ResemblyzerEncoder(
            "cuda" if (device or "").startswith("cuda") else "cpu")}
        if base_model is not None:
            try:
                self.encoders["model"] = ModelSpeakerEncoder(base_model, device or "cpu")
            except VoxshardError as exc:
                emitter.log(f"The model's own speaker encoder is not available: {exc.message}",
                            level="warning")

    def embed(self, audio: np.ndarray, sample_rate: int) -> dict[str, np.ndarray]:
        return {k: enc.embed(audio, sample_rate) for k, enc in self.encoders.items()}

    def reference(self, voice: Voice, run_dir: Path, limit: int) -> Reference:
        from engine.asr.wer import word_count
        from engine.audio.io import read_mono
        from engine.data.codes import read_manifest
        from engine.data.dataset import split_ids
        from engine.quality.similarity import centroid, self_similarity

        try:
            clips = read_manifest(voice.path)
        except (VoxshardError, OSError) as exc:
            raise WorkspaceError(f"The voice {voice.path.name} has no prepared clips to compare "
                                 "renders with.", "Run `voxshard-engine prepare` first.") from exc
        if not clips:
            raise WorkspaceError(f"The voice {voice.path.name} has no usable prepared clips to "
                                 "compare renders with.", "Run `voxshard-engine prepare` first.")
        data = _run_config(run_dir).get("data") or {}
        try:
            _, val = split_ids([c["id"] for c in clips], float(data.get("val_fraction", 0.05)),
                               int(data.get("val_min", 2)), int(data.get("seed", 0)))
        except (TypeError, ValueError):
            val = []
        held_out = len(val) >= 1
        chosen = [c for c in clips if c["id"] in set(val)] if held_out else clips
        chosen = chosen[:limit]
        embeds: dict[str, list[np.ndarray]] = {k: [] for k in self.encoders}
        words = 0
        speech_s = 0.0
        out: list[dict[str, Any]] = []
        for c in chosen:
            path = voice.path / c["path"]
            audio = read_mono(path, 24000)
            for k, v in self.embed(audio, 24000).items():
                embeds[k].append(v)
            if c.get("text"):
                words += word_count(c["text"])
                speech_s += speech_span_s(audio, 24000)
            out.append({**c, "abs": str(path)})
        return Reference(
            clips=out, held_out=held_out,
            words_per_s=(words / speech_s) if speech_s > 0 and words else None,
            centroid={k: centroid(v) for k, v in embeds.items()},
            self_similarity={k: self_similarity(v) for k, v in embeds.items()})

    def measure(self, audio: np.ndarray, sample_rate: int, text: str, ref: Reference,
                language: str | None) -> dict[str, Any]:
        from engine.asr.recognizer import to_16k
        from engine.asr.wer import word_count, word_errors
        from engine.quality.similarity import cosine

        emb = self.embed(audio, sample_rate)
        heard = self.asr.transcribe(to_16k(audio, sample_rate), language)
        errors = word_errors(text, heard.text)
        span = speech_span_s(audio, sample_rate)
        wps = word_count(text) / span if span > 0 else 0.0
        out: dict[str, Any] = {
            "similarity": _r(cosine(emb["resemblyzer"], ref.centroid["resemblyzer"])),
            "similarity_model": (_r(cosine(emb["model"], ref.centroid["model"]))
                                 if "model" in emb else None),
            "heard": heard.text, "wer": _r(errors.wer),
            "duration_s": _r(len(audio) / sample_rate, 3), "speech_s": _r(span, 3),
            "words_per_s": _r(wps, 3),
            "rate_ratio": _r(wps / ref.words_per_s, 3) if ref.words_per_s else None,
            **level_figures(audio, sample_rate),
        }
        return out


# -- the evaluation ----------------------------------------------------------------------------

METRICS = ("similarity", "similarity_model", "wer", "words_per_s", "rate_ratio",
           "loudness_lufs", "peak_dbfs", "clipped_fraction")


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float)
            and math.isfinite(r[key])]
    return _r(float(np.mean(vals))) if vals else None


def _means(renders: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the sentences. The speaking rate of a sentence cut at its length cap
    says nothing, so the rate is averaged over the sentences that ended when any did
    (else over all, marked `rate_from_capped`)."""
    ended = [r for r in renders if not r["capped"]]
    out: dict[str, Any] = {m: _mean(renders, m) for m in METRICS}
    for m in ("words_per_s", "rate_ratio"):
        out[m] = _mean(ended or renders, m)
    out["rate_from_capped"] = not ended
    out["capped"] = len(renders) - len(ended)
    return out


def _key(source: Any, sentences: list[str], options: dict[str, Any], asr_model: str,
         ref_ids: list[str], encoders: list[str]) -> str:
    ckpt = getattr(source, "checkpoint", None)
    stamp = None
    if ckpt is not None:
        marker = Path(ckpt) / "COMPLETE"
        stamp = marker.stat().st_mtime if marker.exists() else None
    elif source.kind == "custom_voice":
        cfg = Path(source.model_dir) / "config.json"
        stamp = cfg.stat().st_mtime if cfg.exists() else None
    blob = json.dumps({"v": FORMAT, "kind": source.kind, "model": str(source.model_dir),
                       "ckpt": str(ckpt) if ckpt else None, "stamp": stamp,
                       "ref": str(getattr(source, "reference", None)),
                       "ref_text": getattr(source, "reference_text", None),
                       "sentences": sentences, "options": options, "asr": asr_model,
                       "refs": ref_ids, "enc": encoders}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def zero_shot_mode(source: Any) -> str:
    """How the zero-shot clone speaks: in-context (clip + transcript) or x-vector only."""
    return "in_context" if getattr(source, "reference_text", None) else "x_vector"


def _gone(checkpoint: Path | None) -> bool:
    """True when a checkpoint is no longer complete on disk (training pruned it)."""
    return checkpoint is not None and not (Path(checkpoint) / "COMPLETE").exists()


def _plan_sources(voice: Voice, run_dir: Path, checkpoints: list[Path], zero_shot: bool,
                  export: bool | str | Path, base: str | None, base_dir: Path,
                  emitter: Emitter, skipped: list[dict[str, Any]]) -> list[Any]:
    from engine.synth.voice import checkpoint_step, reference_clip, resolve_source

    sources = []
    for c in checkpoints:
        try:
            sources.append(resolve_source(str(c), base=base))
        except VoxshardError:
            if not _gone(c):
                raise
            skipped.append(_skip_note(checkpoint_step(c), c.name))
    if zero_shot:
        ref = reference_clip(voice.path)
        if ref is None:
            emitter.log("The voice has no reference clip, so there is no zero-shot baseline.",
                        level="warning")
        else:
            model = sources[0].model_dir if sources else base_dir
            sources.insert(0, resolve_source(str(model), reference=ref))
    if export:
        folder = Path(export) if isinstance(export, str | Path) and not isinstance(export, bool) \
            else _latest_export(voice)
        if folder is not None:
            try:
                sources.append(resolve_source(str(folder)))
            except VoxshardError as exc:
                emitter.log(f"The export {folder.name} is skipped: {exc.message}",
                            level="warning")
    return sources


def evaluate(voice: Voice | str | os.PathLike[str], run: str | None = None,
             checkpoints: str | list[str] | None = "all", *,
             sentences: list[str] | None = None, seed: int = 0, asr: Any = None,
             zero_shot: bool = True, export: bool | str | Path = True,
             options: Any = None, device: str | None = None, dtype: Any = None,
             base: str | None = None, references: int = MAX_REFERENCES, force: bool = False,
             out_dir: str | os.PathLike[str] | None = None,
             on_event: EventCallback | Emitter | None = None,
             cancel: threading.Event | None = None,
             skipped: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Render, measure and report (see the module doc). Returns the evaluation dict
    plus "summary", "path" (evaluation.json) and "html" (report.html).

    `checkpoints=[]` measures no checkpoint (the zero-shot baseline of a run that has
    none yet). With `skipped` (a list, as `watch` passes), a checkpoint training deletes
    before or while it is measured is skipped and noted in the report instead of ending
    the evaluation; the caller's own notes in that list are reported too."""
    from engine.asr.recognizer import describe
    from engine.config.speak import SpeakOptions
    from engine.model.loading import resolve_model
    from engine.synth.voice import checkpoint_step, run_base_model

    em = as_emitter(on_event)
    v = voice if isinstance(voice, Voice) else open_voice(voice)
    sentences = [s.strip() for s in (sentences or HELD_OUT_SENTENCES) if s and s.strip()]
    if not sentences:
        raise InputError("No sentences to evaluate with.", "Give at least one sentence.")
    tolerant = skipped is not None
    notes: list[dict[str, Any]] = list(skipped or [])
    run_dir = pick_run(v, run, need_checkpoint=not (tolerant or checkpoints == []))
    out = Path(out_dir) if out_dir else run_dir / EVAL_DIR
    picked = pick_checkpoints(run_dir, checkpoints, out, em, notes if tolerant else None)
    base_name = base or run_base_model(run_dir)
    if not base_name:
        raise WorkspaceError(f"The run {run_dir.name} does not say which base model it "
                             "trained.", "Give the base model with --base.")
    base_dir = resolve_model(base_name, download=False)
    opts = options if options is not None else SpeakOptions()
    if isinstance(opts, dict):
        opts = SpeakOptions.from_dict(opts)
    # one seed for every voice, and the raw level (loudness is one of the figures)
    opts = opts.replace(seed=seed, loudness_lufs=None)
    em.state("evaluating", detail=f"{run_dir.name}: {len(picked)} checkpoint(s)")
    started = time.perf_counter()
    meter = Meter(asr, base_dir, device, em)
    ref = meter.reference(v, run_dir, references)
    skipped_now: list[dict[str, Any]] = []
    sources = _plan_sources(v, run_dir, picked, zero_shot, export, base, base_dir, em,
                            skipped_now)
    if skipped_now and not tolerant:
        raise _deleted(skipped_now[0]["checkpoint"])
    notes += skipped_now
    asr_model = f"{meter.asr.backend}:{meter.asr.model}"
    prev_data = _previous(out) or {}
    same_setup = (prev_data.get("sentences") == sentences and prev_data.get("seed") == seed
                  and prev_data.get("options") == opts.to_dict()
                  and (prev_data.get("asr") or {}).get("key") == asr_model)
    history = list(prev_data.get("entries") or []) if same_setup else []
    previous = {e.get("key"): e for e in history} if not force else {}
    entries: list[dict[str, Any]] = []
    synth: Any = None
    total = len(sources) * len(sentences)
    done = 0
    for n, source in enumerate(sources):
        if cancel is not None and cancel.is_set():
            raise Cancelled("Evaluation was cancelled; nothing was written.")
        step = checkpoint_step(source.checkpoint) if source.checkpoint else None
        key = _key(source, sentences, opts.to_dict(), asr_model,
                   [c["id"] for c in ref.clips], sorted(meter.encoders))
        if key in previous and all((out / r["path"]).is_file()
                                   for r in previous[key].get("renders", [])):
            entry = previous[key]
            em.log(f"{source.label}: measured before, reused.")
        else:
            em.state("evaluating", detail=source.label, index=n, total=len(sources))
            t0 = time.perf_counter()
            try:
                if _gone(source.checkpoint):
                    raise FileNotFoundError(str(source.checkpoint))
                synth = _ready(synth, source, device, dtype, em)
                speeches = synth.speak_many(sentences, opts, em, cancel)
            except Exception as exc:
                # a checkpoint pruned under us fails in many ways (missing shard, torn
                # read); only that case is skipped, anything else is a real failure
                if not _gone(source.checkpoint):
                    raise
                if not tolerant:
                    raise _deleted(Path(source.checkpoint).name) from exc
                notes.append(_skip_note(step, Path(source.checkpoint).name))
                em.log(f"{source.label} was deleted by training before it was measured; "
                       "skipped (noted in the report).", level="warning")
                synth = None  # it may be half switched to the vanished weights
                gc.collect()
                done += len(sentences)
                continue
            render_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            renders = []
            folder = out / "renders" / (slug(source.label) or f"voice-{n}")
            for i, (text, speech) in enumerate(zip(sentences, speeches, strict=True)):
                from engine.synth.render import write_audio

                path = write_audio(folder / f"{i + 1:02d}.wav", speech.audio, "wav",
                                   speech.sample_rate)
                row = {"sentence": i, "text": text, "path": _rel(path, out),
                       "capped": any(c.get("capped") for c in speech.chunks),
                       **meter.measure(speech.audio, speech.sample_rate, text, ref,
                                       v.language)}
                renders.append(row)
                done += 1
                em.progress("evaluate", done, total, label=source.label, sentence=i)
            entry = {
                "key": key, "label": source.label, "kind": source.kind, "step": step,
                "checkpoint": str(source.checkpoint) if source.checkpoint else None,
                "model": str(source.model_dir),
                "mode": zero_shot_mode(source) if source.kind == "zero_shot" else None,
                "reference": str(source.reference) if source.reference else None,
                "renders": renders, "render_s": round(render_s, 3),
                "measure_s": round(time.perf_counter() - t1, 3), "created": now_iso(),
            }
            entry["mean"] = _means(renders)
        if key in previous:
            done += len(sentences)
            em.progress("evaluate", done, total, label=source.label)
        entries.append(entry)
        _emit_metric(em, entry)
    del synth
    gc.collect()
    evaluated = list(entries)
    entries = _merge(history, entries)
    result = _assemble(v, run_dir, base_dir, sentences, seed, opts.to_dict(), meter, ref,
                       entries, out, describe(asr) if not hasattr(asr, "transcribe") else None)
    result["asr"]["key"] = asr_model
    result["evaluated"] = [e["label"] for e in evaluated]
    result["skipped"] = _skipped(prev_data.get("skipped") or [], notes, entries)
    result["elapsed_s"] = round(time.perf_counter() - started, 3)
    from engine.quality.report import render_html

    out.mkdir(parents=True, exist_ok=True)
    best = result.get("best") or {}
    if best.get("checkpoint"):
        from engine.train.best import keep_best

        # training prunes old checkpoints; the best one stays (hard links, no extra space)
        if keep_best(run_dir, best["checkpoint"]) is not None:
            em.log(f"Kept {Path(best['checkpoint']).name} (the best so far) from pruning.",
                   level="debug")
    write_json(out / "evaluation.json", result)
    write_text(out / "report.html", render_html(result))
    em.artifact(str(out / "evaluation.json"), role="evaluation")
    em.artifact(str(out / "report.html"), role="evaluation_report")
    return {**result, "path": str(out / "evaluation.json"), "html": str(out / "report.html"),
            "summary": format_summary(result, out)}


def _deleted(name: str) -> WorkspaceError:
    return WorkspaceError(f"{name} was deleted before it could be measured (training keeps "
                          "only its newest checkpoints).",
                          "Evaluate again: the checkpoints still on disk will be measured.")


def _skipped(before: list[dict[str, Any]], now: list[dict[str, Any]],
             entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checkpoints never measured because training deleted them first, by step (one note
    each; a checkpoint measured after all is not listed)."""
    measured = {e.get("step") for e in entries if e["kind"] == "checkpoint"}
    notes = {(n.get("step"), n.get("checkpoint")): n for n in [*before, *now]
             if isinstance(n, dict) and n.get("step") not in measured}
    return sorted(notes.values(), key=lambda n: n.get("step") or 0)


def _merge(history: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every voice measured with these settings: earlier checkpoints stay in the history
    (even once training pruned them), the fresh measurement of a voice replaces its old one;
    zero-shot first, then checkpoints by step, then exports."""
    def ident(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["kind"], e.get("step") if e["kind"] == "checkpoint" else e.get("model"))

    merged = {ident(e): e for e in history}
    merged.update({ident(e): e for e in fresh})
    order = {"zero_shot": 0, "checkpoint": 1, "custom_voice": 2}
    return sorted(merged.values(), key=lambda e: (order.get(e["kind"], 3), e.get("step") or 0,
                                                  e["label"]))


def _ready(synth: Any, source: Any, device: str | None, dtype: Any, em: Emitter) -> Any:
    """A synthesizer speaking `source`: the loaded one switched in place when it shares
    the model (zero-shot and checkpoints sit on one base), else a fresh load."""
    from engine.synth.synthesizer import Synthesizer

    if synth is not None and Path(synth.source.model_dir) == Path(source.model_dir) and \
            source.kind != "custom_voice" and synth.source.kind != "custom_voice":
        synth.use_source(source, on_event=em)
        return synth
    if synth is not None:
        del synth
        gc.collect()
    return Synthesizer.load(source, device=device, dtype=dtype, on_event=em)


def _emit_metric(em: Emitter, entry: dict[str, Any]) -> None:
    mean = entry["mean"]
    values = {f"eval/{k}": mean.get(k) for k in METRICS if mean.get(k) is not None}
    values["eval/capped"] = mean.get("capped", 0)
    if entry.get("step") is not None:
        values["step"] = entry["step"]
    em.metric(values, split="eval", label=entry["label"], source_kind=entry["kind"],
              step=entry.get("step"))
    sim = mean.get("similarity")
    wer = mean.get("wer")
    em.log(f"{entry['label']:<12} similarity {sim if sim is not None else '-'}  "
           f"WER {wer if wer is not None else '-'}  rate x{mean.get('rate_ratio') or '-'}")


def choose_best(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best checkpoint (see the module doc), or None without checkpoints."""
    ckpts = [e for e in entries if e["kind"] == "checkpoint"
             and e["mean"].get("similarity") is not None]
    if not ckpts:
        return None
    wers = [e["mean"]["wer"] for e in ckpts if e["mean"].get("wer") is not None]
    floor = min(wers) if wers else None
    fit = [e for e in ckpts if floor is None or e["mean"].get("wer") is None
           or e["mean"]["wer"] <= floor + WER_SLACK]
    best = max(fit, key=lambda e: (e["mean"]["similarity"], -(e["step"] or 0)))
    return {"label": best["label"], "step": best["step"], "checkpoint": best["checkpoint"],
            "similarity": best["mean"]["similarity"], "wer": best["mean"].get("wer")}


def _warnings(entries: list[dict[str, Any]], ref: Reference) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    zero = next((e for e in entries if e["kind"] == "zero_shot"), None)
    zs = zero["mean"].get("similarity") if zero else None
    zw = zero["mean"].get("wer") if zero else None
    for e in entries:
        m, label = e["mean"], e["label"]
        if e["kind"] != "zero_shot" and zs is not None and m.get("similarity") is not None \
                and m["similarity"] < zs - SIMILARITY_DROP:
            out.append({"label": label, "code": "below_zero_shot",
                        "message": f"{label} sounds less like the speaker than the zero-shot "
                                   f"clone (similarity {m['similarity']:.3f} < {zs:.3f})."})
        if e["kind"] != "zero_shot" and zw is not None and m.get("wer") is not None \
                and m["wer"] > zw + 0.2:
            out.append({"label": label, "code": "wer_rose",
                        "message": f"{label} says the words worse than the zero-shot clone "
                                   f"(WER {m['wer']:.2f} > {zw:.2f})."})
        ratio = m.get("rate_ratio")
        if ratio is not None and not m.get("rate_from_capped") \
                and not RATE_BAND[0] <= ratio <= RATE_BAND[1]:
            kind = "faster" if ratio > 1 else "slower"
            out.append({"label": label, "code": "rate_drift",
                        "message": f"{label} speaks {kind} than the speaker "
                                   f"({ratio:.2f} x their rate)."})
        if (m.get("clipped_fraction") or 0) > 0.001:
            out.append({"label": label, "code": "clipping",
                        "message": f"{label} clips ({100 * m['clipped_fraction']:.2f} % of "
                                   "samples at full scale)."})
        if m.get("capped"):
            out.append({"label": label, "code": "no_end",
                        "message": f"{label} did not end {m['capped']} sentence(s) by itself "
                                   "(cut at the length cap)."})
    return out


def _assemble(voice: Voice, run_dir: Path, base_dir: Path, sentences: list[str], seed: int,
              options: dict[str, Any], meter: Meter, ref: Reference,
              entries: list[dict[str, Any]], out: Path, asr_spec: str | None) -> dict[str, Any]:
    zero = next((e for e in entries if e["kind"] == "zero_shot"), None)
    return {
        "format": FORMAT, "created": now_iso(), "voice": str(voice.path),
        "speaker": voice.display_name, "language": voice.language, "run": run_dir.name,
        "run_dir": str(run_dir), "base_model": str(base_dir), "sentences": sentences,
        "seed": seed, "options": options,
        "asr": {"backend": meter.asr.backend, "model": meter.asr.model, "spec": asr_spec},
        "encoders": {"similarity": "resemblyzer",
                     "similarity_model": "model" if "model" in meter.encoders else None},
        "baseline": {"label": zero["label"], "mode": zero["mode"]} if zero else None,
        "reference": ref.to_dict(out), "entries": entries, "best": choose_best(entries),
        "warnings": _warnings(entries, ref),
    }


def format_summary(result: dict[str, Any], out: Path) -> str:
    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    fresh = len(result.get("evaluated") or result["entries"])
    lines = [f"Evaluated {fresh} voice(s) of run {result['run']} ({len(result['entries'])} "
             f"in the report) on {len(result['sentences'])} held-out sentence(s) "
             f"(seed {result['seed']}, ASR {result['asr']['backend']}).",
             f"  {'voice':<14}{'similarity':>11}{'(model)':>9}{'WER':>7}{'rate':>7}"
             f"{'LUFS':>8}{'clip %':>8}"]
    for e in result["entries"]:
        m = e["mean"]
        mark = " *" if result.get("best") and e["label"] == result["best"]["label"] else ""
        lines.append(f"  {e['label'][:14]:<14}{f(m.get('similarity'), '.3f'):>11}"
                     f"{f(m.get('similarity_model'), '.3f'):>9}{f(m.get('wer'), '.2f'):>7}"
                     f"{f(m.get('rate_ratio'), '.2f'):>7}{f(m.get('loudness_lufs'), '.1f'):>8}"
                     f"{f(100 * m['clipped_fraction'] if m.get('clipped_fraction') is not None else None, '.2f'):>8}{mark}")  # noqa: E501
    ceiling = result["reference"]["self_similarity"].get("resemblyzer")
    if ceiling is not None:
        lines.append(f"  real clips of the speaker score {ceiling:.3f} (the ceiling).")
    if result.get("baseline"):
        lines.append(f"  zero-shot baseline: {result['baseline']['mode'].replace('_', '-')} "
                     "cloning.")
    if result.get("best"):
        lines.append(f"  best checkpoint: {result['best']['label']} (*).")
    for w in result["warnings"]:
        lines.append(f"  warning: {w['message']}")
    gone = [n for n in result.get("skipped") or [] if n.get("step") is not None]
    if gone:
        lines.append(f"  not measured (deleted by training first): step "
                     f"{', '.join(str(n['step']) for n in gone)}.")
    lines.append(f"Report: {display_path(out / 'report.html')}")
    return "\n".join(lines)


def watch(voice: Voice | str | os.PathLike[str], run: str | None = None, *,
          interval_s: float = 15.0, idle_s: float | None = None, patience: int | None = None,
          stop: threading.Event | None = None,
          on_event: EventCallback | Emitter | None = None, **kwargs: Any) -> dict[str, Any]:
    """Evaluate each checkpoint of a run as training writes it, in this process (start it
    as a second engine process beside training, which then never waits for it).

    The zero-shot clone (and the voice's export) is measured first, as soon as the run
    says its base model, so the baseline is there before the first checkpoint. Then the
    run is polled every `interval_s`: the newest unmeasured checkpoint is rendered and
    measured, one per pass, so a watcher slower than training falls behind gracefully
    (it always measures the newest; older ones it measures while they last). A checkpoint
    training deletes before it was measured is skipped and noted in the report; the
    watcher never stops for it. `evaluation.json` and the report grow, and a `state`
    event `evaluation_updated` carries the best checkpoint so far. With `patience`, a
    `state` event `early_stop_suggested` (and a warning) says when the best has not
    improved for that many evaluated checkpoints; stopping training stays the caller's
    decision. Returns the last evaluation when `stop` is set, after `idle_s` seconds
    without a new checkpoint, or on Ctrl-C.
    """
    from engine.synth.voice import checkpoint_step, list_run_checkpoints, run_base_model

    em = as_emitter(on_event)
    v = voice if isinstance(voice, Voice) else open_voice(voice)
    if run:
        run_dir = Path(run) if Path(run).is_dir() else v.runs_dir / run
    else:
        found = [p for p in v.runs_dir.iterdir() if p.is_dir()] if v.runs_dir.is_dir() else []
        if not found:
            raise WorkspaceError(f"The voice {v.path.name} has no training run to watch.",
                                 "Start training first, or give --run.")
        run_dir = max(found, key=lambda p: p.stat().st_mtime)
    measured: set[str] = set()
    listed: dict[str, int | None] = {}  # every checkpoint seen on disk, by name
    noted: set[str] = set()
    baseline = False
    result: dict[str, Any] = {}
    best_step: int | None = None
    since_best = 0
    suggested = False
    last_new = time.monotonic()
    em.state("watching", detail=str(run_dir))

    def pruned() -> list[dict[str, Any]]:
        """Checkpoints seen but deleted by training before this watcher reached them."""
        present = {c.name for c in list_run_checkpoints(run_dir)}
        gone = [n for n in listed if n not in measured and n not in present and n not in noted]
        for name in gone:
            em.log(f"{name} was deleted by training before it was measured; skipped "
                   "(noted in the report).", level="warning")
        return [_skip_note(listed[n], n) for n in gone]

    zero_shot, export = kwargs.pop("zero_shot", True), kwargs.pop("export", True)

    def run_once(checkpoints: list[str], notes: list[dict[str, Any]]) -> dict[str, Any]:
        nonlocal baseline
        out = evaluate(v, str(run_dir), checkpoints, zero_shot=zero_shot and not baseline,
                       export=export and not baseline, on_event=em, skipped=notes, **kwargs)
        baseline = True
        noted.update(n["checkpoint"] for n in out.get("skipped") or [])
        nonlocal last_new
        last_new = time.monotonic()  # idle means no new checkpoint, not a long evaluation
        return out

    try:
        while stop is None or not stop.is_set():
            for c in list_run_checkpoints(run_dir):
                listed.setdefault(c.name, checkpoint_step(c))
            new = sorted((n for n in listed if n not in measured and n not in noted),
                         key=lambda n: listed[n] or 0)
            present = {c.name for c in list_run_checkpoints(run_dir)}
            todo = [n for n in new if n in present]
            if todo:
                last_new = time.monotonic()
                newest = todo[-1]
                if len(todo) > 1:
                    em.log(f"Training is ahead of the evaluation: measuring {newest} first "
                           f"({len(todo) - 1} older checkpoint(s) wait while they last).")
                result = run_once([newest], pruned())
                if newest not in noted:
                    measured.add(newest)
                best = result.get("best") or {}
                if best.get("step") == best_step:
                    since_best += 1
                else:
                    best_step, since_best = best.get("step"), 0
                em.state("evaluation_updated", detail=f"best: {best.get('label')}",
                         best_step=best_step, checkpoints=len(measured), path=result["path"],
                         skipped=len(noted))
                if patience and since_best >= patience and not suggested:
                    suggested = True
                    em.log(f"The best checkpoint (step {best_step}) has not improved for "
                           f"{since_best} evaluated checkpoints: training longer is unlikely "
                           "to help.", level="warning")
                    em.state("early_stop_suggested", best_step=best_step,
                             detail=f"no improvement for {since_best} checkpoints")
                continue  # the next newest at once: training may be ahead
            if not baseline and run_base_model(run_dir):
                # the zero-shot baseline before the first checkpoint exists
                result = run_once([], pruned())
                em.state("evaluation_updated", detail="baseline", best_step=None,
                         checkpoints=0, path=result["path"], skipped=len(noted))
                continue
            elif new and not todo:
                notes = pruned()
                if notes and baseline:
                    result = run_once([], notes)  # the note lands in the report
            if idle_s is not None and time.monotonic() - last_new > idle_s:
                break
            if stop is not None:
                stop.wait(interval_s)
            else:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        em.log("Stopped watching.")
    if not result:
        return {"run": run_dir.name, "entries": [], "best": None,
                "summary": f"No checkpoint of {run_dir.name} appeared while watching."}
    return result
