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

Where the parts live: measuring a render in `engine.quality.measure`, the watcher beside
training in `engine.quality.watch`, the report (the HTML page and the summary in words) in
`engine.quality.report`; callers import each name from its home.
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

from engine.asr.recognizer import describe
from engine.config.evaluate import EvaluateConfig
from engine.config.speak import SpeakOptions
from engine.core.atomic import locked, write_json, write_text
from engine.core.errors import InputError, VoxshardError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.kinds import VoiceKind
from engine.layout import run as run_layout
from engine.layout.checkpoints import COMPLETE, HELD_DIR, kept_best, run_of, step_of
from engine.layout.exports import latest_export
from engine.layout.manifest import reference_clip
from engine.layout.run import EVALUATION_FILE, REPORT_FILE, Run, read_evaluation
from engine.layout.tiers import is_adapter, read_adapter_info, run_adapter_dir
from engine.layout.voice import Voice, now_iso, open_voice
from engine.model.loading import resolve_model
from engine.quality.measure import METRICS, Meter, Reference, means_of, relative_path, rounded
from engine.quality.render_set import (
    Loading,
    Rendered,
    RenderSet,
    deleted_error,
    plan_sources,
    render_folder,
    write_renders,
)
from engine.quality.report import format_summary, render_html
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
    data = read_evaluation(out_dir / EVALUATION_FILE)
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
            missing.append(skip_note(step, name))
    return sorted(dict.fromkeys(picked), key=lambda p: step_of(p) or 0)


#: why a checkpoint was not measured: training pruned it first (the usual case)
PRUNED = ("training deleted it (keeping only its newest checkpoints) before it was "
          "measured")


def skip_note(step: int | None, name: str, reason: str = PRUNED) -> dict[str, Any]:
    return {"step": step, "checkpoint": name, "reason": reason}


# -- the evaluation ----------------------------------------------------------------------------

def _key(source: Any, sentences: list[str], options: dict[str, Any], asr_model: str,
         ref_ids: list[str], encoders: list[str]) -> str:
    ckpt = getattr(source, "checkpoint", None)
    stamp = None
    if ckpt is not None:
        marker = Path(ckpt) / COMPLETE
        stamp = marker.stat().st_mtime if marker.exists() else None
        # a copy kept under best/ or held/ has the same files (links, same times): one key
        ckpt = run_of(ckpt) / Path(ckpt).name
    elif source.kind == VoiceKind.CUSTOM_VOICE:
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
        notes += [skip_note(step_of(c), c.name) for c in missing]
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
        if source.kind != VoiceKind.CHECKPOINT or not self.style_sentences:
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
            renders.append({"sentence": i, "text": text, "path": relative_path(path, self.out),
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
            "mode": zero_shot_mode(source) if source.kind == VoiceKind.ZERO_SHOT else None,
            "reference": str(source.reference) if source.reference else None,
            # the plain renders' time (the style renders report their own)
            "renders": renders, "render_s": round(done.render_s - (done.extra or {}).get(
                "render_s", 0.0), 3),
            "measure_s": round(time.perf_counter() - started, 3), "created": now_iso(),
        }
        entry["mean"] = means_of(renders)
        if done.extra is not None:
            entry["styles"] = done.extra
        return entry


def style_summary(found: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    """`style_obedience`'s answer as an entry's "styles" (see the module doc)."""
    plain = found.get("plain") or {}
    per: dict[str, Any] = {}
    for style, s in found["styles"].items():
        change = {k: rounded(s[k] - plain[k]) if isinstance(s.get(k), int | float)
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
            "share": rounded(sum(p["obeyed"] for p in per.values()) / checked) if checked else None,
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
            notes.append(skip_note(step_of(name), name))
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
    from engine.train.export import export  # noqa: PLC0415

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
    measured = {e.get("step") for e in entries if e["kind"] == VoiceKind.CHECKPOINT}
    notes = {(n.get("step"), n.get("checkpoint")): n for n in [*before, *now]
             if isinstance(n, dict) and n.get("step") not in measured}
    return sorted(notes.values(), key=lambda n: n.get("step") or 0)


def _count(run: Run, entries: list[dict[str, Any]], skipped: list[dict[str, Any]]
           ) -> dict[str, int]:
    """How many checkpoints were measured of how many there were: every one training
    recorded as written (`Run.written`), and any other measured or noted."""
    measured = {e.get("step") for e in entries if e["kind"] == VoiceKind.CHECKPOINT}
    written = set(run.written().values()) | measured \
        | {n.get("step") for n in skipped if n.get("step") is not None}
    return {"measured": len(measured), "written": len(written), "skipped": len(skipped)}


def _merge(history: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every voice measured with these settings: earlier checkpoints stay in the history
    (even once training pruned them), the fresh measurement of a voice replaces its old one;
    zero-shot first, then checkpoints by step, then exports."""
    def entry_key(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["kind"], e.get("step") if e["kind"] == VoiceKind.CHECKPOINT else e.get("model"))

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
    ckpts = [e for e in entries if e["kind"] == VoiceKind.CHECKPOINT
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
    zero = next((e for e in entries if e["kind"] == VoiceKind.ZERO_SHOT), None)
    zs = zero["mean"].get("similarity") if zero else None
    zw = zero["mean"].get("wer") if zero else None
    for e in entries:
        m, label = e["mean"], e["label"]
        if e["kind"] != VoiceKind.ZERO_SHOT and zs is not None and m.get("similarity") is not None \
                and m["similarity"] < zs - SIMILARITY_DROP:
            out.append({"label": label, "code": "below_zero_shot",
                        "message": f"{label} sounds less like the speaker than the zero-shot "
                                   f"clone (similarity {m['similarity']:.3f} < {zs:.3f})."})
        if e["kind"] != VoiceKind.ZERO_SHOT and zw is not None and m.get("wer") is not None \
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
    zero = next((e for e in entries if e["kind"] == VoiceKind.ZERO_SHOT), None)
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
