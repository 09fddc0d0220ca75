"""The engine's Python API for scripts: the same operations as `voxshard-engine`.

Every long operation takes `on_event`, a callable receiving `engine.core.events.Event`
objects (progress, log, metric, artifact, state), and raises a subclass of
`engine.core.errors.VoxshardError` with a one-sentence message and a hint.
Each operation imports its machinery when called, so `from engine import api`
stays instant for a script that only creates voices.

    from engine import api

    voice = api.create_voice("voices/ada", speaker="Ada")
    api.import_files(voice, ["recordings/"], on_event=print)
    report = api.prepare(voice)
    api.train(voice.path, base="Qwen/Qwen3-TTS-12Hz-0.6B-Base", workers=2, steps=200)
    api.export(voice.path, "exports/ada")
    api.speak("exports/ada", "Hello from my own voice.", "hello.wav")

Importing this module is cheap: torch and ray load inside the calls that use them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from engine.core.events import Emitter, EventCallback, as_emitter

__all__ = [
    "compare", "create_voice", "delete_voice", "download_model", "evaluate", "export",
    "import_files", "inspect_model", "list_voices", "make_tiny_model", "next_prompt",
    "open_voice", "plan", "prepare", "read", "recognize", "serve", "speak", "train",
    "transcribe",
]

PathLike = str | os.PathLike[str]


def create_voice(path: PathLike, speaker: str, language: str = "english") -> Any:
    """Create a voice folder (voice.toml, takes/, prepared/, runs/, exports/, renders/)."""
    from engine.layout.voice import create_voice as _create

    return _create(path, speaker, language)


def open_voice(path: PathLike) -> Any:
    from engine.layout.voice import open_voice as _open

    return _open(path)


def list_voices(workspace: PathLike) -> list[Path]:
    from engine.layout.voice import list_voices as _list

    return _list(workspace)


def delete_voice(path: PathLike) -> None:
    from engine.layout.voice import delete_voice as _delete

    _delete(path)


def _path(path: PathLike) -> Path:
    from engine.core.storage import user_path

    return user_path(path)


def _voice(voice: Any) -> Any:
    return voice if hasattr(voice, "list_takes") else open_voice(voice)


def next_prompt(voice: Any, set_name: str | None = None) -> Any:
    """The next prompt sentence this voice has not recorded yet (None when all are done)."""
    from engine.layout.voice_prompts import next_prompt as _next

    return _next(_voice(voice), set_name)


def import_files(voice: Any, paths: list[PathLike], transcripts: PathLike | None = None,
                 on_event: EventCallback | Emitter | None = None,
                 transcribe: bool | str | None = None) -> Any:
    """Copy audio files/folders into the voice, untouched, with their transcripts.
    `transcribe` (True or a recognizer spec): speech recognition fills the missing ones."""
    from engine.prepare.importer import import_files as _import

    # paths as typed: ~ and relative ones (the CLI does the same in engine.cli.main)
    paths = [_path(p) for p in paths]
    transcripts = None if transcripts is None else _path(transcripts)
    return _import(_voice(voice), paths, transcripts=transcripts, on_event=on_event,
                   transcribe=transcribe)


def prepare(voice: Any, on_event: EventCallback | Emitter | None = None,
            **options: Any) -> dict[str, Any]:
    """24 kHz mono, loudness, trim, slice, quality report; returns the report.

    `options`: speakers="auto"|"off", speaker_reference=CLIP, denoise=True,
    settings={"target_lufs": -20} (any `PrepareConfig` field, for this prepare)
    (engine.prepare.pipeline.prepare)."""
    from engine.prepare.pipeline import prepare as _prepare

    return _prepare(_voice(voice), on_event=on_event, **options)


def make_tiny_model(out_dir: PathLike, seed: int = 0) -> Path:
    from engine.model.tiny import make_tiny_model as _make

    return _make(_path(out_dir), seed=seed)


def download_model(repo_id: str, on_event: EventCallback | Emitter | None = None) -> Path:
    from engine.model.loading import download_model as _download

    return _download(repo_id, on_event=on_event)


def inspect_model(name_or_path: PathLike) -> Any:
    from engine.model.loading import inspect_model as _inspect
    from engine.model.loading import resolve_model

    return _inspect(resolve_model(name_or_path, download=False))


def plan(voice: PathLike, base: str, on_event: EventCallback | Emitter | None = None,
         **options: Any) -> dict[str, Any]:
    """Predicted memory per GPU/worker for a run; starts nothing."""
    from engine.train.driver import train as _train

    return _train(voice, base, dry_run=True, on_event=on_event, **options)


def train(voice: PathLike, base: str, on_event: EventCallback | Emitter | None = None,
          **options: Any) -> dict[str, Any]:
    """Fine-tune `base` on a prepared voice with Ray Train + FSDP2 (`engine.train.driver`).

    Options are the training settings by field name (workers, steps, epochs, lr,
    batch_size, trainable, lora_rank, predictor_frames, ...: every field of
    `engine.config.train.REQUEST_SETTINGS`, each documented and bounded in its config
    section) and the request's own (resume, run, address, storage, use_gpu, ...:
    `engine.train.request.TrainRequest`). `settings={"optim.weight_decay": 0.0}` gives any
    training setting by its path, `config="runs/<run>/config.json"` a whole config (JSON
    or TOML) under them; the result of a dry run says where each value came from
    (`provenance`, `engine.config.layers`).
    """
    from engine.train.driver import train as _train

    return _train(voice, base, on_event=on_event, **options)


def export(voice: PathLike, out_dir: PathLike, run: str | None = None, step: int | None = None,
           on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Write a run's checkpoint as an official custom_voice model folder."""
    from engine.train.export import export as _export

    return _export(voice, Path(out_dir), run=run, step=step, on_event=on_event)


def speak(model_or_voice: PathLike, text: str, out: PathLike, *,  # noqa: PLR0913
          checkpoint: str | None = None, reference: PathLike | None = None,
          reference_text: str | None = None, device: str | None = None,
          on_event: EventCallback | Emitter | None = None, stream: bool = False,
          quantize: str | None = None, **options: Any) -> dict[str, Any]:
    """Render `text` to an audio file from an export, a voice/run checkpoint, or a base
    model with a reference clip (zero-shot preview: in-context cloning when
    `reference_text`, or the workspace's transcript of the clip, is known).
    `stream`: write the file as it grows. `quantize="int8"`: faster CPU decoding,
    not bit-exact. `options`: the `SpeakOptions` fields by name (an unknown one is refused)."""
    from engine.config.speak import SpeakOptions, audio_format
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    emitter = as_emitter(on_event)
    out = _path(out)
    fmt = audio_format(str(out), None)
    source = resolve_source(model_or_voice, checkpoint=checkpoint,
                            reference=None if reference is None else str(reference),
                            reference_text=reference_text)
    synth = Synthesizer.load(source, device=device, on_event=emitter, quantize=quantize)
    return synth.speak_to_file(text, out, SpeakOptions.from_dict(options), fmt, emitter,
                               stream=stream)


def serve(settings: Any = None, *, on_event: EventCallback | Emitter | None = None,
          **fields: Any) -> Any:
    """Serve voices through OpenAI's `POST /v1/audio/speech` (and Wyoming) from this process,
    as `voxshard-engine serve` does: `settings` is an `engine.config.serve.ServeSettings`,
    `fields` its fields by name (targets, workspace, host, port, api_key_file, ...), each
    checked against its bounds; both: the fields change the settings. Returns once the
    server answers: a handle with `url`, `port`, `stop()` (what was served) and `wait()`,
    also a context manager that stops it."""
    import dataclasses

    from engine.config.schema import refuse_unknown
    from engine.config.serve import ServeSettings
    from engine.core.storage import expand_arg
    from engine.serve.server import start

    refuse_unknown(ServeSettings, fields, "serve setting", "settings")

    # paths as typed (~, relative), as the CLI takes them; a hub id stays one
    for name in ("workspace", "api_key_file", "reference_base"):
        if fields.get(name) is not None:
            fields[name] = expand_arg(os.fspath(fields[name]))
    if fields.get("targets") is not None:
        targets = fields["targets"]
        if isinstance(targets, str | os.PathLike):  # one voice, not its name's letters
            targets = [targets]
        fields["targets"] = [expand_arg(os.fspath(t)) for t in targets]
    if settings is None:
        settings = ServeSettings(**fields)
    elif fields:
        settings = dataclasses.replace(settings, **fields)
    return start(settings, on_event)


def read(request: Any, on_event: EventCallback | Emitter | None = None,
         cancel: threading.Event | None = None) -> dict[str, Any]:
    """Read a script or a book in your voices (`engine.config.read.ReadRequest`): render
    each part of a line (a sentence group) that has no take yet, then write
    `request.out` (WAV, FLAC, MP3 or M4B)."""
    from engine.read import read as _read

    return _read(request, as_emitter(on_event), cancel)


def compare(target: PathLike, out_dir: PathLike, sentences: list[str] | None = None,
            on_event: EventCallback | Emitter | None = None,
            cancel: threading.Event | None = None, **fields: Any) -> dict[str, Any]:
    """Render the same sentences from several checkpoints (and zero-shot) into an A/B folder.
    `fields`: the other fields of `engine.quality.compare.CompareRequest`."""
    from engine.quality.compare import CompareRequest
    from engine.quality.compare import compare as _compare

    return _compare(CompareRequest(target, out_dir, sentences, **fields), on_event, cancel)


def transcribe(voice: Any, asr: Any = None, *, takes: list[str] | None = None,
               recheck: bool = False, threshold: float | None = None, device: str | None = None,
               on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Speech recognition over a voice's takes: fill missing transcripts (marked machine-made)
    and flag takes whose recognised words differ a lot from their transcript.
    `asr`: "pocketsphinx", "auto", a Whisper hub id or folder (see `engine.asr.recognizer`)."""
    from engine.prepare.transcribe import transcribe_takes

    return transcribe_takes(_voice(voice), asr, takes=takes, recheck=recheck,
                            threshold=threshold, device=device, on_event=on_event)


def recognize(audio: PathLike, asr: Any = None, language: str | None = None,
              device: str | None = None) -> dict[str, Any]:
    """What speech recognition hears in one audio file: text, timed words, language."""
    from engine.asr.recognizer import transcribe_file

    heard = transcribe_file(audio, asr, language, device)
    return {**heard.to_dict(), "rtf": round(heard.rtf, 3)}


def evaluate(voice: Any, run: str | None = None, checkpoints: str | list[str] | None = "all",
             on_event: EventCallback | Emitter | None = None,
             cancel: threading.Event | None = None, **fields: Any) -> dict[str, Any]:
    """Render held-out sentences from the zero-shot clone, each checkpoint and the export;
    measure speaker similarity, word error rate, speaking rate and loudness; write
    `<run>/evaluation/evaluation.json` and `report.html` (see `engine.quality.evaluate`).
    `fields`: the other fields of `engine.quality.evaluate.EvaluateRequest`."""
    from engine.quality.evaluate import EvaluateRequest
    from engine.quality.evaluate import evaluate as _evaluate

    return _evaluate(EvaluateRequest(_voice(voice), run, checkpoints, **fields), on_event,
                     cancel)


def reinforce(voice: Any, run: str | None = None, on_event: EventCallback | Emitter | None = None,
              cancel: threading.Event | None = None, **fields: Any) -> dict[str, Any]:
    """The reinforce stage of a run: GRPO from its best checkpoint, rewarded by speaker
    similarity, word errors, length-cap hits and speaking rate; checkpoints of the same
    format in the run (see `engine.reinforce.session`). `fields`: the other fields of
    `ReinforceRequest` (checkpoint, config, resume, asr, device)."""
    from engine.reinforce.session import ReinforceRequest
    from engine.reinforce.session import reinforce as _reinforce

    return _reinforce(ReinforceRequest(_voice(voice), run, **fields), on_event, cancel)
