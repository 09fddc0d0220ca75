"""A/B folder: the same sentences, the same seed, several checkpoints of a run.

Layout of the output folder::

    index.json          what was rendered (sentences, seed, options, entries)
    index.html          a table a browser plays: one row per sentence,
                        one column per voice (zero-shot, step 100, step 200...)
    <label>/NN.wav      sentence NN in that voice

The render stage is `engine.quality.render_set`, shared with `evaluate`: the base model
is loaded once and each checkpoint only swaps the trained tensors in place, so comparing
five checkpoints costs one model load.
"""

from __future__ import annotations

import html
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.config.speak import SpeakOptions
from engine.core.atomic import write_json, write_text
from engine.core.errors import InputError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.checkpoints import holds_checkpoints, run_of, step_of
from engine.layout.manifest import reference_clip
from engine.layout.run import Run, pick_run
from engine.quality.render_set import (
    Loading,
    RenderSet,
    deleted_error,
    plan_sources,
    render_folder,
    write_renders,
)
from engine.synth.voice import VoiceSource

DEFAULT_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "I'd like a cup of coffee, with a little milk, please.",
    "Is it going to rain tomorrow, or will the sun come out?",
]


@dataclass(frozen=True)
class CompareRequest:
    """What to compare: the same object from the CLI and the Python API (the app runs
    the CLI). `validated()` fills the defaults and checks the sentences once.

    target: a run folder, one of its checkpoints, or a voice (its latest run with a
    checkpoint). checkpoints: names or steps (default: every complete one). zero_shot:
    the zero-shot preview first, cloning `reference` (default: the voice's reference
    clip, the one training took the x-vector from). base: the base model the
    checkpoints sit on (default: the run's own). options: the speech controls; no seed
    means seed 0 (one seed for every voice is the point of the comparison). device,
    dtype, quantize, fuse: how the model is loaded (`Synthesizer.load`).
    """

    target: str | os.PathLike[str]
    out_dir: str | os.PathLike[str]
    sentences: Sequence[str] | None = None
    checkpoints: Sequence[str] | None = None
    options: SpeakOptions | None = None
    zero_shot: bool = True
    reference: str | os.PathLike[str] | None = None
    base: str | None = None
    device: str | None = None
    dtype: Any = None
    quantize: str | None = None
    fuse: bool = False

    def validated(self) -> CompareRequest:
        """This request with its defaults filled in, or an InputError."""
        sentences = [s.strip() for s in (self.sentences or DEFAULT_SENTENCES) if s.strip()]
        if not sentences:
            raise InputError("No sentences to compare.", "Give at least one sentence.")
        options = self.options or SpeakOptions()
        if options.seed is None:
            options = options.replace(seed=0)
        return replace(self, sentences=sentences, options=options)

    @property
    def loading(self) -> Loading:
        return Loading(self.device, self.dtype, self.quantize, self.fuse)


def _run_of(target: Path) -> Run:
    if target.is_dir() and step_of(target) is not None:
        return Run(run_of(target))
    if holds_checkpoints(target):
        return Run(target)
    run = pick_run(target, with_checkpoint=True) if target.is_dir() else None
    if run is None:
        raise WorkspaceError(f"{target} is not a training run and holds no run with checkpoints.",
                             "Give a run folder (<voice>/runs/<run>) or a voice that was trained.")
    return run


def plan_comparison(request: CompareRequest) -> list[VoiceSource]:
    """The voices to compare: the zero-shot preview first (base weights), then checkpoints."""
    run = _run_of(Path(request.target).expanduser())
    if request.checkpoints:
        picked = [run.find_checkpoint(c) for c in request.checkpoints]
    else:
        picked = run.checkpoints()
    if not picked:
        raise WorkspaceError(f"The run {run.name} has no complete checkpoint yet.",
                             "Train longer, then compare.")
    reference = None
    if request.zero_shot:
        voice = run.voice_dir
        reference = Path(request.reference) if request.reference \
            else (reference_clip(voice) if voice else None)
    return plan_sources(picked, base=request.base, reference=reference)


def compare(request: CompareRequest, on_event: EventCallback | Emitter | None = None,
            cancel: threading.Event | None = None) -> dict[str, Any]:
    """Render the sentences with every checkpoint (and the zero-shot preview) into the
    request's `out_dir`; returns a JSON-able summary."""
    emitter = as_emitter(on_event)
    request = request.validated()
    sentences, options = list(request.sentences or ()), request.options or SpeakOptions()
    sources = plan_comparison(request)
    out = Path(request.out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    renders = RenderSet(sources, sentences, options, request.loading)
    for done in renders.render(emitter, cancel, stage="comparing"):
        source = done.source
        if done.speeches is None:  # gone: training deleted the checkpoint meanwhile
            raise deleted_error(Path(str(source.checkpoint)).name) from done.error
        paths = write_renders(render_folder(out, source, done.index), done.speeches)
        files = [{"sentence": i, "path": str(path.relative_to(out)),
                  "duration_s": round(speech.duration_s, 3),
                  "frames": sum(c["frames"] for c in speech.chunks)}
                 for i, (path, speech) in enumerate(zip(paths, done.speeches, strict=True))]
        spoken = done.spoken or source
        entries.append({"label": source.label, "kind": source.kind,
                        "checkpoint": str(source.checkpoint) if source.checkpoint else None,
                        "step": step_of(source.checkpoint) if source.checkpoint else None,
                        "reference": str(source.reference) if source.reference else None,
                        "mode": spoken.to_dict()["mode"], "files": files})
        emitter.progress("voices", done.index + 1, len(sources), label=source.label)
    index = {"sentences": sentences, "seed": options.seed, "options": options.to_dict(),
             "model": str(sources[0].model_dir), "entries": entries}
    write_json(out / "index.json", index)
    write_text(out / "index.html", _html(index))
    emitter.artifact(str(out / "index.html"), role="comparison")
    return {"path": str(out), "index": str(out / "index.json"), "html": str(out / "index.html"),
            "voices": [e["label"] for e in entries], "sentences": len(sentences),
            "seed": options.seed,
            "summary": f"Compared {len(entries)} voice(s) on {len(sentences)} sentence(s): "
                       f"open {out / 'index.html'}"}


def _html(index: dict[str, Any]) -> str:
    entries = index["entries"]
    head = "".join(f"<th>{html.escape(e['label'])}</th>" for e in entries)
    rows = []
    for i, sentence in enumerate(index["sentences"]):
        cells = "".join(
            f'<td><audio controls preload="none" src="{html.escape(e["files"][i]["path"])}">'
            f"</audio></td>" for e in entries)
        rows.append(f"<tr><td>{html.escape(sentence)}</td>{cells}</tr>")
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Voxshard comparison"
            "</title><style>body{font-family:sans-serif}td,th{padding:6px;border-bottom:1px "
            "solid #ddd;text-align:left}</style></head><body>\n"
            f"<h1>Checkpoint comparison</h1><p>Seed {index['seed']}, model "
            f"{html.escape(index['model'])}</p>\n"
            f"<table><tr><th>Sentence</th>{head}</tr>\n" + "\n".join(rows)
            + "\n</table></body></html>\n")
