"""Evaluate a run: is the clone getting better, and does it still say the words?

`evaluate(EvaluateRequest(voice, run, checkpoints))` renders a fixed set of held-out
sentences with one seed (the render stage `engine.quality.render_set`, shared with
`compare`) from
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
Each voice is written there as soon as it is measured (before its `metric` event),
so a stop or a crash loses at most the voice being measured; two evaluations of one
run at once (the watcher beside training and the window's Evaluate now) merge what
they measured under the file's lock (`core.atomic.locked`) instead of overwriting it.

Best checkpoint: the highest independent similarity among the checkpoints
whose word error rate is within `WER_SLACK` of the lowest checkpoint WER
(a voice that sounds right but mumbles is not the best) and that left no more
sentences unended than the fewest of those did: hit the length cap or cut by the
runaway guard (`engine.synth.runaway`: a loop or silence), counted per checkpoint
(`runaway` beside `capped`); a voice that does not end its sentences is not the best
either. Training's and the reinforce stage's checkpoints alike. Among those, with
`EvaluateConfig.style_weight` above 0, a checkpoint scores its similarity plus the weight
times the share of its style checks that went the right way (0 by default: similarity
alone).

Styles: for a run trained with style descriptions, each checkpoint also renders the
first `EvaluateConfig.style_sentences` sentences plainly and with each trained style
(`engine.quality.styles.style_obedience`, the model still loaded), and its entry's
"styles" says per style whether it was obeyed (more than half of the checks of its
measurable words went the right way), by how much each measure moved, and the styled
renders' similarity and word errors beside the plain ones; a style whose renders lose
more than `SIMILARITY_DROP` similarity is flagged (`costs_similarity`) and warned of. A
run trained without styles gets none of it: its file is as before.

A LoRA run's adapter voice (`exports/<run>-adapter`, written when the run finished from
its best checkpoint then) follows the best: when an evaluation picks another, the voice
is written again from it (atomically: a failure leaves the old one speaking and says
why), and the result's "adapter_voice" and summary say so; a server serving it sees its
folder change and loads it again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.asr.recognizer import describe, load_recognizer, to_16k
from engine.asr.wer import word_count, word_errors
from engine.audio.io import read_mono
from engine.audio.loudness import integrated_loudness
from engine.audio.vad import speech_regions
from engine.config.evaluate import EvaluateConfig
from engine.config.speak import SpeakOptions
from engine.core.atomic import locked, read_json, write_json, write_text
from engine.core.errors import InputError, VoxshardError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.data.dataset import split_ids
from engine.layout import run as run_layout
from engine.layout.checkpoints import COMPLETE, HELD_DIR, kept_best, run_of, step_of
from engine.layout.exports import latest_export
from engine.layout.manifest import read_manifest, reference_clip
from engine.layout.run import EVALUATION_FILE, REPORT_FILE, Run
from engine.layout.tiers import is_adapter, read_adapter_info, run_adapter_dir
from engine.layout.voice import Voice, display_path, now_iso, open_voice
from engine.model.loading import resolve_model
from engine.prepare.styles import styles_obeyed
from engine.quality.rate_thirds import RATE_THIRDS, rate_thirds
from engine.quality.render_set import (
    Loading,
    Rendered,
    RenderSet,
    deleted_error,
    plan_sources,
    render_folder,
    write_renders,
)
from engine.quality.report import render_html
from engine.quality.similarity import (
    ModelSpeakerEncoder,
    ResemblyzerEncoder,
    centroid,
    cosine,
    self_similarity,
)
from engine.quality.styles import style_obedience
from engine.synth.runaway import cut_reasons
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import VoiceSource, trained_styles

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

def pick_run(voice: Voice, run: str | None, need_checkpoint: bool = True) -> Path:
    """The named run (name or path), else the latest with a checkpoint, else the latest
    (`engine.layout.run.pick_run`). `need_checkpoint=False` accepts a run that has none
    yet (the zero-shot baseline)."""
    found = run_layout.pick_run(voice.path, run, with_checkpoint=True) \
        or run_layout.pick_run(voice.path, run)
    if found is None and run:
        names = [r.name for r in voice.runs()]
        raise InputError(f"The voice {voice.path.name} has no run {run!r}.",
                         f"Its runs: {', '.join(names)}." if names else "Train the voice first.")
    if found is None:
        raise WorkspaceError(f"The voice {voice.path.name} has no training run yet, so "
                             "there is nothing to evaluate.",
                             "Train it first with `voxshard-engine train`.",
                             window_hint="Press Start training first.")
    if need_checkpoint and not found.checkpoints():
        raise WorkspaceError(f"The run {found.name} has no complete checkpoint yet, so "
                             "there is nothing to evaluate.",
                             "Train longer (a checkpoint is written every few hundred steps), "
                             "or pick another run with --run.",
                             window_hint="Train longer (Checkpoint every sets how often one "
                                         "is written), or choose another run in the Run list above "
                                         "the charts.")
    return found.path


def _previous(out_dir: Path) -> dict[str, Any] | None:
    data = read_json(out_dir / EVALUATION_FILE)
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _best_by_validation(run_dir: Path) -> int | None:
    """Step of the lowest validation loss in metrics.jsonl (when it has one)."""
    best: tuple[float, int] | None = None
    for rec in Run(run_dir).metrics():
        values = rec.get("values", rec)
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
    found = Run(run_dir).checkpoints()
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
        prev = _previous(out_dir)
        best = (prev or {}).get("best") or {}
        kept = Run(run_dir).checkpoint(best["step"]) if isinstance(best.get("step"), int) \
            else None
        if kept is not None:
            emitter.log(f"Best checkpoint of the last evaluation: step {best['step']}.")
            return [kept]
        val = _best_by_validation(run_dir)
        kept = Run(run_dir).checkpoint(val) if val is not None else None
        if kept is not None:
            emitter.log(f"No evaluation yet; step {val} has the lowest validation loss.")
            return [kept]
        emitter.log("No evaluation and no validation loss yet; using the latest checkpoint.",
                    level="warning")
        return found[-1:]
    picked: list[Path] = []
    for w in wanted:
        try:
            picked.append(Run(run_dir).find_checkpoint(w))
        except VoxshardError:
            if missing is None:
                raise
            name = Path(str(w)).name
            step = step_of(name) if not name.isdigit() else int(name)
            missing.append(_skip_note(step, name))
    return sorted(dict.fromkeys(picked), key=lambda p: step_of(p) or 0)


#: why a checkpoint was not measured: training pruned it first (the usual case)
PRUNED = ("training deleted it (keeping only its newest checkpoints) before it was "
          "measured")


def _skip_note(step: int | None, name: str, reason: str = PRUNED) -> dict[str, Any]:
    return {"step": step, "checkpoint": name, "reason": reason}


# -- measuring ------------------------------------------------------------------------------------

def speech_span_s(audio: np.ndarray, sample_rate: int) -> float:
    """Seconds from the first to the last speech region (pauses inside count, silence around
    does not); the whole length when no region is found."""
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

        try:
            clips = read_manifest(voice.path)
        except (VoxshardError, OSError) as exc:
            raise WorkspaceError(f"The voice {voice.path.name} has no prepared clips to compare "
                                 "renders with.", "Run `voxshard-engine prepare` first.") from exc
        if not clips:
            raise WorkspaceError(f"The voice {voice.path.name} has no usable prepared clips to "
                                 "compare renders with.", "Run `voxshard-engine prepare` first.")
        data = Run(run_dir).config().get("data") or {}
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
            **rate_thirds(heard.words),
            **level_figures(audio, sample_rate),
        }
        return out


# -- the evaluation ----------------------------------------------------------------------------

METRICS = ("similarity", "similarity_model", "wer", "words_per_s", "rate_ratio",
           "loudness_lufs", "peak_dbfs", "clipped_fraction", *RATE_THIRDS)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float)
            and math.isfinite(r[key])]
    return _r(float(np.mean(vals))) if vals else None


def _means(renders: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the sentences. The speaking rate of a sentence cut at its length cap
    or by the runaway guard says nothing, so the rate is averaged over the sentences
    that ended when any did (else over all, marked `rate_from_capped`). `runaway`: the
    sentences the guard cut (a loop or silence)."""
    ended = [r for r in renders if not r["capped"] and not r.get("runaway")]
    out: dict[str, Any] = {m: _mean(renders, m) for m in METRICS}
    for m in ("words_per_s", "rate_ratio", *RATE_THIRDS):
        out[m] = _mean(ended or renders, m)
    out["rate_from_capped"] = not ended
    out["capped"] = sum(1 for r in renders if r["capped"])
    out["runaway"] = sum(1 for r in renders if r.get("runaway"))
    return out


def _key(source: Any, sentences: list[str], options: dict[str, Any], asr_model: str,
         ref_ids: list[str], encoders: list[str]) -> str:
    ckpt = getattr(source, "checkpoint", None)
    stamp = None
    if ckpt is not None:
        marker = Path(ckpt) / COMPLETE
        stamp = marker.stat().st_mtime if marker.exists() else None
        # a copy kept under best/ or held/ has the same files (links, same times): one key
        ckpt = run_of(ckpt) / Path(ckpt).name
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


@dataclass(frozen=True)
class EvaluateRequest:
    """What to evaluate: the same object from the CLI and the Python API (the app runs
    the CLI). `validated()` fills the defaults and checks them once.

    run: a run name or folder (default: the latest with a checkpoint, `pick_run`).
    checkpoints: "all", "latest", "best", steps or names ("100,200"), or a list of them;
    an empty list measures none (the zero-shot baseline of a run that has none yet).
    sentences: default `HELD_OUT_SENTENCES`; seed: the one seed of every voice. asr: a
    recogniser spec (`engine.asr.recognizer`) or a loaded recogniser. zero_shot: measure
    the zero-shot clone; export: the voice's latest export (True), a given export folder,
    or none (False). options: speech controls (`SpeakOptions` or its dict); the seed and
    the raw level are the evaluation's. device, dtype: where the voices load; base: the
    base model (default: the run's). references: held-out clips used at most. force:
    measure again what was measured before. out_dir: default `<run>/evaluation/`.
    skipped: notes of checkpoints training deleted first (`watch` passes them); given, a
    checkpoint deleted before or while it is measured is noted instead of failing.
    config: the style renders and the best rule's style weight (`EvaluateConfig`).
    """

    voice: Voice | str | os.PathLike[str]
    run: str | None = None
    checkpoints: str | list[str] | None = "all"
    sentences: Sequence[str] | None = None
    seed: int = 0
    asr: Any = None
    zero_shot: bool = True
    export: bool | str | os.PathLike[str] = True
    options: SpeakOptions | dict[str, Any] | None = None
    device: str | None = None
    dtype: Any = None
    base: str | None = None
    references: int = MAX_REFERENCES
    force: bool = False
    out_dir: str | os.PathLike[str] | None = None
    skipped: Sequence[dict[str, Any]] | None = None
    config: EvaluateConfig | None = None

    def validated(self) -> EvaluateRequest:
        """This request with its defaults filled in (`options` a `SpeakOptions` with the
        evaluation's seed and no loudness matching), or an InputError."""
        sentences = [s.strip() for s in (self.sentences or HELD_OUT_SENTENCES)
                     if s and s.strip()]
        if not sentences:
            raise InputError("No sentences to evaluate with.", "Give at least one sentence.")
        # one seed for every voice, and the raw level (loudness is one of the figures)
        opts = _speak_options(self.options).replace(seed=self.seed, loudness_lufs=None)
        return replace(self, sentences=sentences, options=opts,
                       config=self.config or EvaluateConfig())


def _speak_options(options: SpeakOptions | dict[str, Any] | None) -> SpeakOptions:
    opts = options if options is not None else SpeakOptions()
    return SpeakOptions.from_dict(opts) if isinstance(opts, dict) else opts


def _plan(request: EvaluateRequest, voice: Voice, picked: list[Path], base_dir: Path,
          em: Emitter, notes: list[dict[str, Any]] | None) -> list[VoiceSource]:
    """The voices to measure (`render_set.plan_sources`). A checkpoint deleted before it
    resolved is noted in `notes`, or, without notes, an error."""
    reference = None
    if request.zero_shot:
        reference = reference_clip(voice.path)
        if reference is None:
            em.log("The voice has no reference clip, so there is no zero-shot baseline.",
                   level="warning")
    export = None
    if request.export:
        export = Path(request.export) if isinstance(request.export, str | os.PathLike) \
            else latest_export(voice.path)
    missing: list[Path] = []
    sources = plan_sources(picked, base=request.base, reference=reference,
                           zero_shot_model=base_dir, export=export, emitter=em,
                           missing=missing)
    if missing and notes is None:
        raise deleted_error(missing[0].name)
    if notes is not None:
        notes += [_skip_note(step_of(c), c.name) for c in missing]
    return sources


class _Measuring:
    """The renders of one evaluation measured, or taken from the last evaluation when the
    same voice was measured with the same settings and its files are still there."""

    def __init__(self, request: EvaluateRequest, voice: Voice, out: Path, meter: Meter,
                 ref: Reference, previous: dict[str, dict[str, Any]]) -> None:
        self.request, self.voice, self.out = request, voice, out
        self.meter, self.ref, self.previous = meter, ref, previous
        self.options = _speak_options(request.options).to_dict()
        self.asr_model = f"{meter.asr.backend}:{meter.asr.model}"
        self.keys: dict[int, str] = {}

    def key(self, n: int, source: VoiceSource) -> str:
        if n not in self.keys:
            # a voice with style renders measures more: a key of its own (others keep theirs)
            styles = self.styles_of(source)
            options = {**self.options, "styles": styles,
                       "style_sentences": self.style_sentences} if styles else self.options
            self.keys[n] = _key(source, list(self.request.sentences or ()),
                                options, self.asr_model,
                                [c["id"] for c in self.ref.clips], sorted(self.meter.encoders))
        return self.keys[n]

    @property
    def style_sentences(self) -> int:
        return (self.request.config or EvaluateConfig()).style_sentences

    def styles_of(self, source: VoiceSource) -> list[str]:
        """The styles a checkpoint is checked for: those its run trained with."""
        if source.kind != "checkpoint" or not self.style_sentences:
            return []
        return trained_styles(source)

    def styles(self, synth: Synthesizer, em: Emitter) -> dict[str, Any] | None:
        """The loaded checkpoint's style renders measured (the module doc), or None."""
        styles = self.styles_of(synth.source)
        if not styles:
            return None
        started = time.perf_counter()
        sentences = list(self.request.sentences or ())[:self.style_sentences]
        keep = ("similarity", "similarity_model", "wer", "words_per_s", "loudness_lufs")

        def figures(audio: np.ndarray, sample_rate: int, text: str) -> dict[str, Any]:
            found = self.meter.measure(audio, sample_rate, text, self.ref, self.voice.language)
            return {k: found.get(k) for k in keep}

        em.log(f"{synth.source.label}: {len(styles)} style(s) on {len(sentences)} "
               "sentence(s), each against the plain render.")
        found = style_obedience(synth, sentences, styles,
                                options=_speak_options(self.request.options), on_event=em,
                                measure=figures)
        return style_summary(found, time.perf_counter() - started)

    def reusable(self, n: int, source: VoiceSource) -> bool:
        entry = self.previous.get(self.key(n, source))
        return entry is not None and all((self.out / r["path"]).is_file()
                                         for r in entry.get("renders", []))

    def reused(self, n: int, source: VoiceSource) -> dict[str, Any]:
        return self.previous[self.key(n, source)]

    def measure(self, done: Rendered, on_sentence: Callable[[int], None]) -> dict[str, Any]:
        source, speeches = done.source, done.speeches or []
        started = time.perf_counter()
        paths = write_renders(render_folder(self.out / "renders", source, done.index), speeches)
        renders = []
        sentences = list(self.request.sentences or ())
        for i, (text, speech, path) in enumerate(zip(sentences, speeches, paths, strict=True)):
            renders.append({"sentence": i, "text": text, "path": _rel(path, self.out),
                            "capped": any(c.get("capped") for c in speech.chunks),
                            # why the runaway guard cut the sentence short, if it did
                            "runaway": next(iter(cut_reasons(speech.chunks)), None),
                            **self.meter.measure(speech.audio, speech.sample_rate, text,
                                                 self.ref, self.voice.language)})
            on_sentence(i)
        entry = {
            "key": self.key(done.index, source), "label": source.label, "kind": source.kind,
            "step": step_of(source.checkpoint) if source.checkpoint else None,
            # the checkpoint as training named it (a held copy is let go once measured)
            "checkpoint": (str(run_of(source.checkpoint) / Path(source.checkpoint).name)
                           if source.checkpoint else None),
            "model": str(source.model_dir),
            "mode": zero_shot_mode(source) if source.kind == "zero_shot" else None,
            "reference": str(source.reference) if source.reference else None,
            # the plain renders' time (the style renders report their own)
            "renders": renders, "render_s": round(done.render_s - (done.extra or {}).get(
                "render_s", 0.0), 3),
            "measure_s": round(time.perf_counter() - started, 3), "created": now_iso(),
        }
        entry["mean"] = _means(renders)
        if done.extra is not None:
            entry["styles"] = done.extra
        return entry


def style_summary(found: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    """`style_obedience`'s answer as an entry's "styles" (see the module doc)."""
    plain = found.get("plain") or {}
    per: dict[str, Any] = {}
    for style, s in found["styles"].items():
        change = {k: _r(s[k] - plain[k]) if isinstance(s.get(k), int | float)
                  and isinstance(plain.get(k), int | float) else None
                  for k in ("similarity", "wer")}
        per[style] = {
            **s, "followed": s["obeyed"] * 2 > s["checked"] if s["checked"] else None,
            "similarity_change": change["similarity"], "wer_change": change["wer"],
            "costs_similarity": change["similarity"] is not None
            and change["similarity"] < -SIMILARITY_DROP}
    checked = sum(p["checked"] for p in per.values())
    return {"sentences": found["sentences"], "plain": plain, "per_style": per,
            "count": len(per), "measurable": sum(1 for p in per.values() if p["checked"]),
            "followed": sum(1 for p in per.values() if p["followed"]),
            "share": _r(sum(p["obeyed"] for p in per.values()) / checked) if checked else None,
            "render_s": round(elapsed_s, 3)}



def _base_dir(run_dir: Path, base: str | None) -> Path:
    base_name = base or Run(run_dir).base_model()
    if not base_name:
        raise WorkspaceError(f"The run {run_dir.name} does not say which base model it "
                             "trained.", "Give the base model with --base.")
    return resolve_model(base_name, download=False)


def evaluate(request: EvaluateRequest, on_event: EventCallback | Emitter | None = None,
             cancel: threading.Event | None = None) -> dict[str, Any]:
    """Render, measure and report (see the module doc). Returns the evaluation dict
    plus "summary", "path" (evaluation.json) and "html" (report.html)."""
    em = as_emitter(on_event)
    request = request.validated()
    v = request.voice if isinstance(request.voice, Voice) else open_voice(request.voice)
    sentences, opts = list(request.sentences or ()), _speak_options(request.options)
    tolerant = request.skipped is not None
    notes: list[dict[str, Any]] = list(request.skipped or [])
    run_dir = pick_run(v, request.run,
                       need_checkpoint=not (tolerant or request.checkpoints == []))
    out = Path(request.out_dir) if request.out_dir else Run(run_dir).evaluation_dir
    picked = pick_checkpoints(run_dir, request.checkpoints, out, em,
                              notes if tolerant else None)
    base_dir = _base_dir(run_dir, request.base)
    em.state("evaluating", detail=f"{run_dir.name}: {len(picked)} checkpoint(s)")
    started = time.perf_counter()
    meter = Meter(request.asr, base_dir, request.device, em)
    ref = meter.reference(v, run_dir, request.references)
    sources = _plan(request, v, picked, base_dir, em, notes if tolerant else None)
    prev_data = _previous(out) or {}
    book = _Book(request, v, run_dir, base_dir, meter, ref, out, started)
    history = list(prev_data.get("entries") or []) if book.same_setup(prev_data) else []
    measuring = _Measuring(request, v, out, meter, ref,
                           {e.get("key"): e for e in history} if not request.force else {})
    entries: list[dict[str, Any]] = []
    total, count = len(sources) * len(sentences), 0
    renders = RenderSet(sources, sentences, opts, Loading(request.device, request.dtype))
    for done in renders.render(em, cancel, stage="evaluating",
                               cancelled="Evaluation was cancelled; what it measured before "
                                         "is kept.",
                               skip=measuring.reusable,
                               then=lambda synth: measuring.styles(synth, em)):
        source = done.source
        if done.gone:
            name = Path(str(source.checkpoint)).name
            if not tolerant:
                raise deleted_error(name) from done.error
            notes.append(_skip_note(step_of(name), name))
            em.log(f"{source.label} was deleted by training before it was measured; "
                   "skipped (noted in the report).", level="warning")
            count += len(sentences)
            continue
        if done.speeches is None:
            entry = measuring.reused(done.index, source)
            em.log(f"{source.label}: measured before, reused.")
            count += len(sentences)
            em.progress("evaluate", count, total, label=source.label)
            entries.append(entry)
        else:
            def sentence_done(i: int, label: str = source.label) -> None:
                nonlocal count
                count += 1
                em.progress("evaluate", count, total, label=label, sentence=i)

            entries.append(measuring.measure(done, sentence_done))
            book.save(entries, notes, em)  # on disk before anyone hears of it
        _emit_metric(em, entries[-1])
    return _follow_best(book.save(entries, notes, em), v, run_dir, em)


def _follow_best(result: dict[str, Any], voice: Voice, run_dir: Path,
                 em: Emitter) -> dict[str, Any]:
    """The run's adapter voice written again from a new best checkpoint (see the module
    doc); `result` with "adapter_voice" and its summary's line when it was (or failed)."""
    best = result.get("best") or {}
    folder = run_adapter_dir(voice.path, run_dir.name)
    if not isinstance(best.get("step"), int) or not is_adapter(folder):
        return result  # no best, or no adapter voice (not a LoRA run, not finished, removed)
    was = str(read_adapter_info(folder).get("checkpoint") or "")
    if step_of(was) == best["step"]:
        return result
    # the export lives with training (which writes the same voice when a run ends); torch
    # and the model code load with it, not when the window imports this module
    from engine.train.driver import export

    try:
        made = export(voice.path, folder, run=run_dir.name, step=best["step"], adapter=True,
                      on_event=em)
    except (VoxshardError, OSError) as exc:
        why = getattr(exc, "message", None) or str(exc)
        em.log(f"The best checkpoint is now {best['label']}, but the adapter voice "
               f"{folder.name} was not written again from it: {why} It still speaks {was}.",
               level="warning")
        return {**result, "adapter_voice": {"out_dir": str(folder), "rewritten": False,
                                            "checkpoint": was, "error": why},
                "summary": result["summary"] + f"\nThe adapter voice {folder.name} still "
                           f"speaks {was}: writing it from {best['label']} failed ({why})"}
    em.log(f"The adapter voice {folder.name} now speaks {best['label']}, the new best "
           f"checkpoint (it spoke {was}).")
    return {**result, "adapter_voice": {**made, "rewritten": True, "was": was},
            "summary": result["summary"] + f"\nAdapter voice {folder.name} written again "
                       f"from the new best checkpoint, {best['label']}."}


@dataclass
class _Book:
    """evaluation.json and report.html of one evaluation, written after every voice it
    measures: what the file holds (another evaluation may have added to it since this
    one started) merged with this one's voices, under the file's lock."""

    request: EvaluateRequest
    voice: Voice
    run_dir: Path
    base_dir: Path
    meter: Meter
    ref: Reference
    out: Path
    started: float

    @property
    def asr_model(self) -> str:
        return f"{self.meter.asr.backend}:{self.meter.asr.model}"

    def same_setup(self, data: dict[str, Any]) -> bool:
        """Whether `data` was measured like this evaluation (its entries compare)."""
        request = self.request
        return (data.get("sentences") == list(request.sentences or ())
                and data.get("seed") == request.seed
                and data.get("options") == _speak_options(request.options).to_dict()
                and (data.get("asr") or {}).get("key") == self.asr_model)

    def save(self, fresh: list[dict[str, Any]], notes: list[dict[str, Any]],
             em: Emitter) -> dict[str, Any]:
        """Write the evaluation with `fresh` (this one's voices) and `notes` (its skipped
        checkpoints); returns it plus "summary", "path" and "html"."""
        path = self.out / EVALUATION_FILE
        with locked(path):
            current = _previous(self.out) or {}
            history = list(current.get("entries") or []) if self.same_setup(current) else []
            entries = _merge(history, fresh)
            result = _assemble(self.request, self.voice, self.run_dir, self.base_dir,
                               self.meter, self.ref, entries, self.out)
            result["asr"]["key"] = self.asr_model
            result["evaluated"] = [e["label"] for e in fresh]
            result["skipped"] = _skipped(current.get("skipped") or [], notes, entries)
            result["count"] = _count(Run(self.run_dir), entries, result["skipped"])
            result["elapsed_s"] = round(time.perf_counter() - self.started, 3)
            _write(result, self.run_dir, self.out, em)
        em.artifact(str(path), role="evaluation")
        em.artifact(str(self.out / REPORT_FILE), role="evaluation_report")
        return {**result, "path": str(path), "html": str(self.out / REPORT_FILE),
                "summary": format_summary(result, self.out)}


def _write(result: dict[str, Any], run_dir: Path, out: Path, em: Emitter) -> None:
    """evaluation.json and report.html; the best checkpoint kept from pruning. The caller
    holds the file's lock (the kept best is one folder for every writer)."""
    out.mkdir(parents=True, exist_ok=True)
    best = result.get("best") or {}
    if best.get("checkpoint"):
        # training prunes old checkpoints; the best one stays (hard links, no extra space),
        # and the file names that copy: the live folder and a held one both go away
        name = Path(best["checkpoint"]).name
        found = [c for c in (run_dir / name, run_dir / HELD_DIR / name)
                 if (c / COMPLETE).is_file()]
        kept = kept_best(run_dir, name) or \
            (Run(run_dir).keep_best(found[0]) if found else None)
        if kept is not None:
            best["checkpoint"] = str(kept)
            em.log(f"Kept {name} (the best so far) from pruning.", level="debug")
    write_json(out / EVALUATION_FILE, result)
    write_text(out / REPORT_FILE, render_html(result))


def _skipped(before: list[dict[str, Any]], now: list[dict[str, Any]],
             entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checkpoints never measured because training deleted them first, by step (one note
    each; a checkpoint measured after all is not listed)."""
    measured = {e.get("step") for e in entries if e["kind"] == "checkpoint"}
    notes = {(n.get("step"), n.get("checkpoint")): n for n in [*before, *now]
             if isinstance(n, dict) and n.get("step") not in measured}
    return sorted(notes.values(), key=lambda n: n.get("step") or 0)


def _count(run: Run, entries: list[dict[str, Any]], skipped: list[dict[str, Any]]
           ) -> dict[str, int]:
    """How many checkpoints were measured of how many there were: every one training
    recorded as written (`Run.written`), and any other measured or noted."""
    measured = {e.get("step") for e in entries if e["kind"] == "checkpoint"}
    written = set(run.written().values()) | measured \
        | {n.get("step") for n in skipped if n.get("step") is not None}
    return {"measured": len(measured), "written": len(written), "skipped": len(skipped)}


def _merge(history: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every voice measured with these settings: earlier checkpoints stay in the history
    (even once training pruned them), the fresh measurement of a voice replaces its old one;
    zero-shot first, then checkpoints by step, then exports."""
    def entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["kind"], e.get("step") if e["kind"] == "checkpoint" else e.get("model"))

    merged = {entry_key(e): e for e in history}
    merged.update({entry_key(e): e for e in fresh})
    order = {"zero_shot": 0, "checkpoint": 1, "custom_voice": 2}
    return sorted(merged.values(), key=lambda e: (order.get(e["kind"], 3), e.get("step") or 0,
                                                  e["label"]))


def _emit_metric(em: Emitter, entry: dict[str, Any]) -> None:
    mean = entry["mean"]
    values = {f"eval/{k}": mean.get(k) for k in METRICS if mean.get(k) is not None}
    values["eval/capped"] = mean.get("capped", 0)
    values["eval/runaway"] = mean.get("runaway", 0)
    if entry.get("step") is not None:
        values["step"] = entry["step"]
    em.metric(values, split="eval", label=entry["label"], source_kind=entry["kind"],
              step=entry.get("step"))
    sim = mean.get("similarity")
    wer = mean.get("wer")
    em.log(f"{entry['label']:<12} similarity {sim if sim is not None else '-'}  "
           f"WER {wer if wer is not None else '-'}  rate x{mean.get('rate_ratio') or '-'}")


def _unended(entry: dict[str, Any]) -> int:
    """Sentences a voice did not end by itself: cut at the cap or by the runaway guard."""
    return int(entry["mean"].get("capped") or 0) + int(entry["mean"].get("runaway") or 0)


def choose_best(entries: list[dict[str, Any]], style_weight: float = 0.0
                ) -> dict[str, Any] | None:
    """The best checkpoint (see the module doc), or None without checkpoints.
    style_weight: `EvaluateConfig.style_weight` (a checkpoint without style figures
    scores none)."""
    ckpts = [e for e in entries if e["kind"] == "checkpoint"
             and e["mean"].get("similarity") is not None]
    if not ckpts:
        return None
    wers = [e["mean"]["wer"] for e in ckpts if e["mean"].get("wer") is not None]
    floor = min(wers) if wers else None
    fit = [e for e in ckpts if floor is None or e["mean"].get("wer") is None
           or e["mean"]["wer"] <= floor + WER_SLACK]
    # a sentence the checkpoint never ended (cut at the length cap, or by the runaway
    # guard: a loop, silence) counts against it, whichever stage wrote it: only those
    # with the fewest such sentences may be best
    fewest = min(_unended(e) for e in fit)
    fit = [e for e in fit if _unended(e) == fewest]

    def score(e: dict[str, Any]) -> float:
        share = (e.get("styles") or {}).get("share")
        return e["mean"]["similarity"] + (style_weight * share if style_weight and
                                          isinstance(share, int | float) else 0.0)

    best = max(fit, key=lambda e: (score(e), -(e["step"] or 0)))
    found = {"label": best["label"], "step": best["step"], "checkpoint": best["checkpoint"],
             "similarity": best["mean"]["similarity"], "wer": best["mean"].get("wer")}
    if "styles" in best:
        found["style_share"] = best["styles"].get("share")
    return found


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
        if m.get("runaway"):
            out.append({"label": label, "code": "runaway",
                        "message": f"{label} ran away in {m['runaway']} sentence(s): it "
                                   "looped or stayed silent until the guard cut it."})
        for style, s in ((e.get("styles") or {}).get("per_style") or {}).items():
            if s.get("costs_similarity"):
                out.append({"label": label, "code": "style_costs_similarity",
                            "message": f"{label} sounds less like the speaker when asked "
                                       f"\"{style}\" (similarity {s['similarity']:.3f}, "
                                       f"{s['similarity_change']:+.3f} against its plain "
                                       "renders)."})
    return out


def _assemble(request: EvaluateRequest, voice: Voice, run_dir: Path, base_dir: Path,
              meter: Meter, ref: Reference, entries: list[dict[str, Any]],
              out: Path) -> dict[str, Any]:
    asr = request.asr
    asr_spec = describe(asr) if not hasattr(asr, "transcribe") else None
    zero = next((e for e in entries if e["kind"] == "zero_shot"), None)
    weight = (request.config or EvaluateConfig()).style_weight
    return {
        "format": FORMAT, "created": now_iso(), "voice": str(voice.path),
        "speaker": voice.display_name, "language": voice.language, "run": run_dir.name,
        "run_dir": str(run_dir), "base_model": str(base_dir),
        "sentences": list(request.sentences or ()), "seed": request.seed,
        "options": _speak_options(request.options).to_dict(),
        "asr": {"backend": meter.asr.backend, "model": meter.asr.model, "spec": asr_spec},
        "encoders": {"similarity": "resemblyzer",
                     "similarity_model": "model" if "model" in meter.encoders else None},
        "baseline": {"label": zero["label"], "mode": zero["mode"]} if zero else None,
        "reference": ref.to_dict(out), "entries": entries,
        "best": choose_best(entries, weight), "warnings": _warnings(entries, ref),
        # the rule's style weight, where there are styles to weigh
        **({"style_weight": weight} if any("styles" in e for e in entries) else {}),
    }


def format_summary(result: dict[str, Any], out: Path) -> str:
    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    fresh = len(result.get("evaluated") or result["entries"])
    count = result.get("count") or {}
    of = (f" {count.get('measured', 0)} of {count['written']} checkpoints measured."
          if count.get("written") else "")
    lines = [f"Evaluated {fresh} voice(s) of run {result['run']} ({len(result['entries'])} "
             f"in the report) on {len(result['sentences'])} held-out sentence(s) "
             f"(seed {result['seed']}, ASR {result['asr']['backend']}).{of}",
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
    for e in result["entries"]:
        if e.get("styles"):
            lines.append(f"  {e['label']}: {styles_obeyed(e['styles'])}.")
    if result.get("best"):
        lines.append(f"  best checkpoint: {result['best']['label']} (*).")
    for w in result["warnings"]:
        lines.append(f"  warning: {w['message']}")
    gone = [n for n in result.get("skipped") or [] if n.get("step") is not None]
    if gone:
        lines.append(f"  not measured: step {', '.join(str(n['step']) for n in gone)}.")
        reasons = dict.fromkeys(str(n.get("reason") or "") for n in gone)
        lines += [f"    ({reason})" for reason in reasons if reason]
    lines.append(f"Report: {display_path(out / REPORT_FILE)}")
    return "\n".join(lines)


def watch(request: EvaluateRequest, *, interval_s: float = 15.0, idle_s: float | None = None,
          patience: int | None = None, stop: threading.Event | None = None,
          on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Evaluate each checkpoint of a run as training writes it, in this process (start it
    as a second engine process beside training, which then never waits for it).

    The zero-shot clone (and the voice's export) is measured first, as soon as the run
    says its base model, so the baseline is there before the first checkpoint. Then the
    run is polled every `interval_s`: the newest unmeasured checkpoint is rendered and
    measured, one per pass, so a watcher slower than training falls behind gracefully
    (it always measures the newest; older ones it measures while they last). Training
    keeps only its newest checkpoints, so the watcher holds each one until it is measured
    (`Run.hold`: hard links pruning cannot take away; `_Holds`): a thread holds every new
    checkpoint as it appears, also while a long render runs (the baseline), at most
    `HELD_MAX` waiting (the oldest waiting is let go for a new one). Every checkpoint
    training wrote (`Run.written`, and what the thread saw) is measured, or skipped and
    noted in the report with why (pruned before it was held, or let go while the
    evaluation was behind); the watcher never stops for one. Training never waits for
    the watcher and keeps no checkpoint for it: the held copies are the watcher's, and
    cost disk only once training has deleted their originals (at most `HELD_MAX`
    checkpoints). `evaluation.json` and the report grow with every
    measured voice, and a `state` event `evaluation_updated` carries the best checkpoint
    so far. With `patience`, a `state` event `early_stop_suggested` (and a warning) says
    when the best has not improved for that many evaluated checkpoints; stopping
    training stays the caller's decision. Returns the last evaluation when `stop` is
    set, after `idle_s` seconds without a new checkpoint while training logs no step (not
    before the run's first step or checkpoint), or on Ctrl-C (SIGTERM).
    `request.checkpoints` is the watcher's.
    """
    watcher = _Watcher(request, as_emitter(on_event), patience)
    watcher.holds.start()
    try:
        while stop is None or not stop.is_set():
            if watcher.one_pass():
                continue  # the next newest at once: training may be ahead
            if idle_s is not None and watcher.idle_for() > idle_s:
                break
            if stop is not None:
                stop.wait(interval_s)
            else:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        watcher.em.log("Stopped watching.")
    finally:
        watcher.holds.close()
    if not watcher.result:
        name = watcher.run.name
        return {"run": name, "entries": [], "best": None,
                "summary": f"No checkpoint of {name} appeared while watching."}
    return watcher.result


#: checkpoints a watcher holds at most while they wait to be measured (each a checkpoint's
#: disk once training has pruned its original; while training keeps it, no extra space)
HELD_MAX = 4


def _behind(n: int) -> str:
    return (f"the evaluation fell {n} checkpoints behind training, and holds at most "
            f"{HELD_MAX} waiting; training deleted this one before it was measured")


class _Holds:
    """The checkpoints a watcher holds from training's pruning (`Run.hold`): each new one as
    it appears, until it is measured, at most `HELD_MAX` of them (the oldest waiting one
    is let go for a new one; the newest are measured first). A thread looks every `poll_s`,
    also while a long render runs (the zero-shot baseline), and remembers every checkpoint
    it saw, so one written and pruned meanwhile is still named."""

    POLL_S = 0.2

    def __init__(self, run: Run) -> None:
        self.run = run
        self.copies: dict[str, Path] = {}  # checkpoint name -> its held copy
        self.busy: str | None = None  # being measured: never let go of before it is done
        self.done: set[str] = set()  # measured or noted: not worth holding
        self.seen: dict[str, int | None] = {}  # every checkpoint listed, by name
        self.dropped: dict[str, str] = {}  # let go before it was measured -> why
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="evaluate-holds", daemon=True)

    def start(self) -> None:
        self.run.release()  # what a watcher killed before left behind
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            self.copies.clear()
            self.run.release()

    def _loop(self) -> None:
        while not self._stop.wait(self.POLL_S):
            try:
                self.hold_new()
            except OSError:  # a folder pruned while it was listed: the next look sees it
                continue

    def names(self) -> set[str]:
        with self._lock:
            return set(self.copies)

    def sightings(self) -> dict[str, int | None]:
        with self._lock:
            return dict(self.seen)

    def hold_new(self) -> None:
        """Hold every checkpoint not measured yet and not held; past `HELD_MAX`, let go of
        the oldest waiting ones (not the one being measured)."""
        with self._lock:
            found = self.run.checkpoints()
            for c in found:
                self.seen.setdefault(c.name, step_of(c.name))
            for c in found:
                if c.name in self.done or c.name in self.copies or c.name in self.dropped:
                    continue
                copy = self.run.hold(c)
                if copy is not None:
                    self.copies[c.name] = copy
            waiting = sorted((n for n in self.copies if n != self.busy),
                             key=lambda n: self.seen.get(n) or 0)
            behind = len(waiting) + (self.busy is not None)
            for name in waiting[:max(0, len(self.copies) - HELD_MAX)]:
                self.run.release(self.copies.pop(name).name)
                self.dropped[name] = _behind(behind)

    def take(self, name: str) -> Path | None:
        """The held copy of `name`, held now if the thread has not yet (None: it cannot be
        held: gone already, or in an object store); kept until `finish(name)`."""
        with self._lock:
            self.busy = name
            copy = self.copies.get(name)
            if copy is None:
                live = self.run.path / name
                copy = self.run.hold(live) if live.is_dir() else None
                if copy is not None:
                    self.copies[name] = copy
            return copy

    def finish(self, names: set[str]) -> None:
        """`names` are measured or noted: let go of their copies."""
        with self._lock:
            self.done |= names
            if self.busy in names:
                self.busy = None
            for name in names & set(self.copies):
                self.run.release(self.copies.pop(name).name)


class _Watcher:
    """What `watch` knows between its passes over the run."""

    def __init__(self, request: EvaluateRequest, em: Emitter, patience: int | None) -> None:
        v = request.voice if isinstance(request.voice, Voice) else open_voice(request.voice)
        found = run_layout.pick_run(v.path, request.run)
        if found is None and not request.run:
            raise WorkspaceError(f"The voice {v.path.name} has no training run to watch.",
                                 "Start training first, or give --run.",
                                 window_hint="Press Start training first.")
        # a named run not there yet: the training just started creates it
        self.run = found if found is not None else v.run(str(request.run))
        self.request = replace(request, voice=v, run=str(self.run.path))
        self.em, self.patience = em, patience
        self.holds = _Holds(self.run)
        self.measured: set[str] = set()
        self.listed: dict[str, int | None] = {}  # every checkpoint seen, by name
        self.noted: set[str] = set()
        self.baseline = False
        self.result: dict[str, Any] = {}
        self.best_step: int | None = None
        self.since_best = 0
        self.suggested = False
        self.last_new = time.monotonic()
        em.state("watching", detail=str(self.run.path))

    def idle_for(self) -> float:
        """Seconds since anything new: a checkpoint measured or noted, or a step training
        logged (a run still training is not idle, however long its next save takes). A
        run that has logged no step and written no checkpoint yet is starting (its
        workers may take minutes), not idle."""
        try:
            stat = self.run.metrics_file.stat()
            logged = time.time() - stat.st_mtime if stat.st_size else None
        except OSError:
            logged = None
        if logged is None and not self.listed:
            return 0.0
        return min(time.monotonic() - self.last_new, math.inf if logged is None else logged)

    def _available(self) -> set[str]:
        """Checkpoints that can still be measured: on disk, or held."""
        present = {c.name for c in self.run.checkpoints()}
        return present | self.holds.names()

    def one_pass(self) -> bool:
        """Measure what is new; True when the next pass should follow at once."""
        available = self._available()
        # what training wrote: what the listing and the holding thread saw, and what
        # training recorded (one written and pruned between two looks included)
        for name, step in [*((n, step_of(n)) for n in available),
                           *self.holds.sightings().items(), *self.run.written().items()]:
            self.listed.setdefault(name, step)
        new = sorted((n for n in self.listed if n not in self.measured and n not in self.noted),
                     key=lambda n: self.listed[n] or 0)
        todo = [n for n in new if n in available]
        if todo:
            self._measure_newest(todo)
            return True
        if not self.baseline and self.run.base_model():
            # the zero-shot baseline before the first checkpoint exists
            self.result = self._evaluate([], self._pruned())
            self.em.state("evaluation_updated", detail="baseline", best_step=None,
                          checkpoints=0, path=self.result["path"], skipped=len(self.noted))
            return True
        if new:
            notes = self._pruned()
            if notes and self.baseline:
                self.result = self._evaluate([], notes)  # the note lands in the report
        return False

    def _measure_newest(self, todo: list[str]) -> None:
        em = self.em
        self.last_new = time.monotonic()
        newest = todo[-1]
        if len(todo) > 1:
            em.log(f"Training is ahead of the evaluation: measuring {newest} first "
                   f"({len(todo) - 1} older checkpoint(s) wait while they last).")
        # the held copy: training may delete the original while it is measured
        source = self.holds.take(newest) or newest
        try:
            self.result = self._evaluate([str(source)], self._pruned())
        finally:
            self.holds.finish({newest} | self.noted)
        if newest not in self.noted:
            self.measured.add(newest)
        best = self.result.get("best") or {}
        if best.get("step") == self.best_step:
            self.since_best += 1
        else:
            self.best_step, self.since_best = best.get("step"), 0
        em.state("evaluation_updated", detail=f"best: {best.get('label')}",
                 best_step=self.best_step, checkpoints=len(self.measured),
                 path=self.result["path"], skipped=len(self.noted))
        if self.patience and self.since_best >= self.patience and not self.suggested:
            self.suggested = True
            em.log(f"The best checkpoint (step {self.best_step}) has not improved for "
                   f"{self.since_best} evaluated checkpoints: training longer is unlikely "
                   "to help.", level="warning")
            em.state("early_stop_suggested", best_step=self.best_step,
                     detail=f"no improvement for {self.since_best} checkpoints")

    def _pruned(self) -> list[dict[str, Any]]:
        """Checkpoints seen but deleted by training before this watcher held them."""
        available = self._available()
        gone = [n for n in self.listed
                if n not in self.measured and n not in available and n not in self.noted]
        for name in gone:
            self.em.log(f"{name} was deleted by training before it was measured; skipped "
                        "(noted in the report).", level="warning")
        return [_skip_note(self.listed[n], n, self.holds.dropped.get(n, PRUNED))
                for n in gone]

    def _evaluate(self, checkpoints: list[str], notes: list[dict[str, Any]]) -> dict[str, Any]:
        first = not self.baseline
        out = evaluate(replace(self.request, checkpoints=checkpoints,
                               zero_shot=self.request.zero_shot and first,
                               export=self.request.export if first else False, skipped=notes),
                       on_event=self.em)
        self.baseline = True
        self.noted.update(n["checkpoint"] for n in out.get("skipped") or [])
        self.last_new = time.monotonic()  # idle means no new checkpoint, not a long evaluation
        return out
