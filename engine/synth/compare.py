"""A/B folder: the same sentences, the same seed, several checkpoints of a run.

Layout of the output folder::

    index.json          what was rendered (sentences, seed, options, entries)
    index.html          a table a browser plays: one row per sentence,
                        one column per voice (zero-shot, step 100, step 200...)
    <label>/NN.wav      sentence NN in that voice

The base model is loaded once; each checkpoint only swaps the trained
tensors in place, so comparing five checkpoints costs one model load.
"""

from __future__ import annotations

import html
import re
import threading
from pathlib import Path
from typing import Any

from engine.config.speak import SpeakOptions
from engine.core.atomic import write_json, write_text
from engine.core.errors import Cancelled, InputError, WorkspaceError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.synth.render import write_audio
from engine.synth.voice import (
    VoiceSource,
    _is_run_dir,
    _latest_run,
    _voice_of_run,
    checkpoint_step,
    list_run_checkpoints,
    pick_checkpoint,
    reference_clip,
    resolve_source,
)

DEFAULT_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "I'd like a cup of coffee, with a little milk, please.",
    "Is it going to rain tomorrow, or will the sun come out?",
]


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "voice"


def _run_of(target: Path) -> Path:
    if target.is_dir() and checkpoint_step(target) is not None:
        return target.parent
    if _is_run_dir(target):
        return target
    run = _latest_run(target) if target.is_dir() else None
    if run is None:
        raise WorkspaceError(f"{target} is not a training run and holds no run with checkpoints.",
                             "Give a run folder (<voice>/runs/<run>) or a voice that was trained.")
    return run


def plan_sources(target: str | Path, checkpoints: list[str] | None, *,
                 zero_shot: bool = True, reference: str | Path | None = None,
                 base: str | None = None) -> list[VoiceSource]:
    """The voices to compare: zero-shot preview first (base weights), then checkpoints."""
    run = _run_of(Path(target).expanduser())
    if checkpoints:
        picked = [pick_checkpoint(run, c) for c in checkpoints]
    else:
        picked = list_run_checkpoints(run)
    if not picked:
        raise WorkspaceError(f"The run {run.name} has no complete checkpoint yet.",
                             "Train longer, then compare.")
    sources = [resolve_source(str(p), base=base) for p in
               sorted(dict.fromkeys(picked), key=lambda p: checkpoint_step(p) or 0)]
    if zero_shot:
        voice = _voice_of_run(run)
        ref = Path(reference) if reference else (reference_clip(voice) if voice else None)
        if ref is not None:
            shot = resolve_source(str(sources[0].model_dir), reference=ref)
            sources.insert(0, shot)
    return sources


def compare(target: str | Path, out_dir: str | Path, sentences: list[str] | None = None,
            checkpoints: list[str] | None = None, *, options: SpeakOptions | None = None,
            zero_shot: bool = True, reference: str | Path | None = None,
            base: str | None = None, device: str | None = None, dtype: Any = None,
            on_event: EventCallback | Emitter | None = None,
            cancel: threading.Event | None = None, quantize: str | None = None,
            fuse: bool = False) -> dict[str, Any]:
    """Render `sentences` with every checkpoint (and the zero-shot preview) into `out_dir`."""
    from engine.synth.synthesizer import Synthesizer

    emitter = as_emitter(on_event)
    sentences = [s.strip() for s in (sentences or DEFAULT_SENTENCES) if s.strip()]
    if not sentences:
        raise InputError("No sentences to compare.", "Give at least one sentence.")
    options = options or SpeakOptions()
    if options.seed is None:
        # one fixed seed for every voice is the point of the comparison
        options = options.replace(seed=0)
    sources = plan_sources(target, checkpoints, zero_shot=zero_shot, reference=reference,
                           base=base)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    synth = Synthesizer.load(sources[0], device=device, dtype=dtype, on_event=emitter,
                             quantize=quantize, fuse=fuse)
    entries: list[dict[str, Any]] = []
    for n, source in enumerate(sources):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        emitter.state("comparing", detail=source.label, index=n, total=len(sources))
        if n:
            synth.use_source(source, on_event=emitter)
        speeches = synth.speak_many(sentences, options, emitter, cancel)
        folder = out / _slug(source.label)
        files = []
        for i, speech in enumerate(speeches):
            path = write_audio(folder / f"{i + 1:02d}.wav", speech.audio, "wav",
                               speech.sample_rate)
            files.append({"sentence": i, "path": str(path.relative_to(out)),
                          "duration_s": round(speech.duration_s, 3),
                          "frames": sum(c["frames"] for c in speech.chunks)})
        entries.append({"label": source.label, "kind": source.kind,
                        "checkpoint": str(source.checkpoint) if source.checkpoint else None,
                        "step": checkpoint_step(source.checkpoint) if source.checkpoint else None,
                        "reference": str(source.reference) if source.reference else None,
                        "mode": synth.source.to_dict()["mode"], "files": files})
        emitter.progress("voices", n + 1, len(sources), label=source.label)
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
