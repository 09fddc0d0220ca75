"""The render stage `compare` and `evaluate` share: which voices speak (the plan), where
each one's renders go (one folder name), and one loop that loads each voice once and
speaks the same sentences with one seed in every voice.

The plan, in order: the zero-shot clone (the base model with a reference clip: the
preview before training), the chosen checkpoints by step, then an export. The zero-shot
clone and the checkpoints sit on one base model: the loop loads it once and switches the
trained tensors in place (`Synthesizer.use_source`), so five checkpoints cost one model
load; an export is a model of its own and is loaded afresh.

Training keeps only its newest checkpoints, so one may be deleted before or while it is
rendered: the loop yields it as `gone` (any failure of a checkpoint no longer complete on
disk) and goes on; the caller says whether that is a note (watching a live run) or an
error. Any other failure is raised.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config.speak import SpeakOptions
from engine.core.errors import Cancelled, VoxshardError, WorkspaceError
from engine.core.events import Emitter
from engine.core.kinds import VoiceKind
from engine.layout.checkpoints import is_complete, step_of
from engine.layout.voice import slug
from engine.synth.render import write_audio
from engine.synth.synthesizer import Speech, Synthesizer
from engine.synth.voice import VoiceSource, resolve_source


@dataclass(frozen=True)
class Loading:
    """How each voice is loaded (`Synthesizer.load`)."""

    device: str | None = None
    dtype: Any = None
    quantize: str | None = None
    fuse: bool = False


def gone(checkpoint: Path | None) -> bool:
    """True when a checkpoint is no longer complete on disk (training pruned it)."""
    return checkpoint is not None and not is_complete(Path(checkpoint))


def deleted_error(name: str) -> WorkspaceError:
    return WorkspaceError(f"{name} was deleted before it could be measured (training keeps "
                          "only its newest checkpoints).",
                          "Evaluate again: the checkpoints still on disk will be measured.")


def plan_sources(checkpoints: Sequence[Path], *, base: str | None = None,
                 reference: Path | None = None, zero_shot_model: Path | None = None,
                 export: Path | None = None, emitter: Emitter | None = None,
                 missing: list[Path] | None = None) -> list[VoiceSource]:
    """The voices to render, in the module doc's order.

    `base` overrides the base model the checkpoints' run names. With `reference`, the
    zero-shot clone comes first, on the checkpoints' base model (`zero_shot_model` when
    there is no checkpoint). An export that cannot be spoken is left out with a warning
    (needs `emitter`). With `missing` (a list), a checkpoint deleted before it resolved is
    appended there instead of failing.
    """
    sources = []
    for ckpt in sorted(dict.fromkeys(checkpoints), key=lambda p: step_of(p) or 0):
        try:
            sources.append(resolve_source(str(ckpt), base=base))
        except VoxshardError:
            if missing is None or not gone(ckpt):
                raise
            missing.append(ckpt)
    model = sources[0].model_dir if sources else zero_shot_model
    if reference is not None and model is not None:
        sources.insert(0, resolve_source(str(model), reference=reference))
    if export is not None:
        try:
            sources.append(resolve_source(str(export)))
        except VoxshardError as exc:
            if emitter is None:
                raise
            emitter.log(f"The export {export.name} is skipped: {exc.message}", level="warning")
    return sources


def render_folder(root: Path, source: VoiceSource, index: int) -> Path:
    """The folder of one voice's renders: its label as a file name ("step 200" ->
    step-200), else its place in the plan."""
    return root / (slug(source.label) or f"voice-{index}")


def write_renders(folder: Path, speeches: Sequence[Speech]) -> list[Path]:
    """Sentence i's render as `folder/NN.wav` (NN = i + 1)."""
    return [write_audio(folder / f"{i + 1:02d}.wav", speech.audio, "wav", speech.sample_rate)
            for i, speech in enumerate(speeches)]


@dataclass
class Rendered:
    """One voice of the plan, as the loop leaves it."""

    index: int
    source: VoiceSource
    #: one per sentence; None when the caller skipped it or it is `gone`
    speeches: list[Speech] | None = None
    #: the voice as the loaded model speaks it (a zero-shot clone's mode, a heard transcript)
    spoken: VoiceSource | None = None
    render_s: float = 0.0
    gone: bool = False
    error: BaseException | None = field(default=None, repr=False)
    #: what `then` found with the voice still loaded (None: no `then`, or it found nothing)
    extra: Any = None


@dataclass(frozen=True)
class RenderSet:
    """The same sentences, with one seed, in every voice of `sources` (see the module doc).

    `options.seed` is the seed every voice uses (None would give each its own)."""

    sources: list[VoiceSource]
    sentences: list[str]
    options: SpeakOptions
    loading: Loading = Loading()

    def render(self, emitter: Emitter, cancel: threading.Event | None = None, *,
               stage: str, cancelled: str = "Cancelled.",
               skip: Callable[[int, VoiceSource], bool] | None = None,
               then: Callable[[Synthesizer], Any] | None = None) -> Iterator[Rendered]:
        """Each voice in order, rendered (or passed over when `skip(index, source)` says
        so: measured before). A `state` event `stage` (detail: the voice's label) starts
        each render; `Cancelled(cancelled)` when `cancel` is set before a voice.
        `then(synth)`: more work with each rendered voice while it is loaded (the
        evaluation's style renders); its answer is the `Rendered.extra`."""
        synth: Synthesizer | None = None
        try:
            for n, source in enumerate(self.sources):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(cancelled)
                if skip is not None and skip(n, source):
                    yield Rendered(n, source)
                    continue
                emitter.state(stage, detail=source.label, index=n, total=len(self.sources))
                started = time.perf_counter()
                try:
                    if gone(source.checkpoint):
                        raise FileNotFoundError(str(source.checkpoint))
                    if synth is not None and not _same_model(synth.source, source):
                        synth = None  # the old model goes before the new one loads
                        gc.collect()
                    if synth is None:
                        synth = self._load(source, emitter)
                    else:
                        synth.use_source(source, on_event=emitter)
                    speeches = synth.speak_many(self.sentences, self.options, emitter, cancel)
                    extra = then(synth) if then is not None else None
                except Exception as exc:
                    # a checkpoint pruned under us fails in many ways (a missing shard, a
                    # torn read); only that case is passed on, anything else is a failure
                    if not gone(source.checkpoint):
                        raise
                    synth = None  # it may be half switched to the vanished weights
                    gc.collect()
                    yield Rendered(n, source, gone=True, error=exc)
                    continue
                yield Rendered(n, source, speeches, synth.source,
                               time.perf_counter() - started, extra=extra)
        finally:
            synth = None
            gc.collect()

    def _load(self, source: VoiceSource, emitter: Emitter) -> Synthesizer:
        load = self.loading
        return Synthesizer.load(source, device=load.device, dtype=load.dtype, on_event=emitter,
                                quantize=load.quantize, fuse=load.fuse)


def _same_model(loaded: VoiceSource, source: VoiceSource) -> bool:
    """Whether `source` can be switched in place of `loaded`: both on one base model (an
    export is a model of its own)."""
    return Path(loaded.model_dir) == Path(source.model_dir) \
        and VoiceKind.CUSTOM_VOICE not in (loaded.kind, source.kind)
