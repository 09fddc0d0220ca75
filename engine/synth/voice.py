"""Which voice to speak with: resolve what the user named, then load it.

The kinds of voice (`engine.core.kinds.VoiceKind`):
- ``custom_voice``: an exported model folder in the official format (a
  speaker row in the codec embedding);
- ``adapter``: an adapter voice (LoRA and a speaker row) on its base model;
- ``checkpoint``: a training run's checkpoint, built in memory from the base
  model plus the checkpoint's trained weights (no export step), speaking with
  the voice's x-vector in the speaker slot, exactly as training saw it;
- ``zero_shot``: a base model plus a reference clip, the preview of the voice
  before any training: in-context cloning when the clip's transcript is known
  (given, or the voice's own transcript of that clip), else the clip's
  x-vector alone.

Resolution is pure path logic (no torch) so errors come fast and clear.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.io import read_mono
from engine.audio.timebase import SAMPLE_RATE
from engine.config.train import ModelConfig
from engine.core.atomic import read_json
from engine.core.errors import InputError, ModelError, VoxshardError, WorkspaceError
from engine.core.kinds import Tier, VoiceKind
from engine.data.codes import load_codes_index
from engine.layout.checkpoints import holds_checkpoints, run_of, step_of
from engine.layout.exports import (
    EXPORT_INFO,
    EXPORTS_DIR,
    exports_dir,
    is_model_folder,
    latest_export,
    list_exports,
)
from engine.layout.manifest import clip_voice, prepared_folder, read_manifest, reference_clip
from engine.layout.run import Run, list_runs, pick_run, runs_dir, voice_base_model
from engine.layout.tiers import (
    INSTANT_DIR,
    instant_base,
    is_adapter,
    list_adapters,
    read_adapter_info,
    read_instant,
    record_instant_base,
)
from engine.layout.voice import is_voice_folder
from engine.model.adapter import load_adapter
from engine.model.checkpoint_weights import trained_weights
from engine.model.loading import inspect_model, local_model_path, resolve_model
from engine.synth.reference import with_silent_tail


@dataclass(frozen=True)
class VoiceSource:
    """A resolved voice, not loaded yet."""

    kind: VoiceKind
    model_dir: Path  # what to load: the export, or the base model
    label: str  # short human name ("step 200", "zero-shot", export name)
    checkpoint: Path | None = None
    reference: Path | None = None
    #: transcript of `reference`: in-context cloning (None: x-vector only)
    reference_text: str | None = None
    speaker: str | None = None
    voice_dir: Path | None = None
    run_dir: Path | None = None
    #: a checkpoint's LoRA scale (alpha / rank) from its run's config; None: not said
    lora_scaling: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": str(self.model_dir), "label": self.label,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None,
                "reference": str(self.reference) if self.reference else None,
                "reference_text": self.reference_text,
                "mode": (None if self.kind != VoiceKind.ZERO_SHOT
                         else "in_context" if self.reference_text else "x_vector"),
                "speaker": self.speaker,
                "voice": str(self.voice_dir) if self.voice_dir else None}


# -- resolution --------------------------------------------------------------------------------

def _model_info(path: Path) -> Any:
    return inspect_model(path)


def _resolve_model(name: str) -> Path:
    return resolve_model(name)


def _checkpoint_source(run_dir: Path, which: str | None, base: str | None) -> VoiceSource:
    run = Run(run_dir)
    ckpt = run.find_checkpoint(which)
    if not isinstance(ckpt, Path):
        raise WorkspaceError(f"The checkpoints of the run {run.name} are in {ckpt.parent}, "
                             "which speaking cannot read from.",
                             "Export the run (`voxshard-engine export` reads the store), then "
                             "speak with the export.")
    base_name = base or run.base_model()
    if not base_name:
        raise WorkspaceError(f"The run {run_dir} does not say which base model it trained.",
                             "Give the base model with --base.")
    model_dir = _resolve_model(base_name)
    info = _model_info(model_dir)
    if info.model_type != "base":
        raise ModelError(f"{model_dir} is not a base model, so it cannot host the checkpoint.",
                         "Give the run's base model with --base.")
    return VoiceSource(kind=VoiceKind.CHECKPOINT, model_dir=model_dir,
                       label=f"step {step_of(ckpt)}", checkpoint=ckpt,
                       voice_dir=run.voice_dir, run_dir=run_dir,
                       speaker=run.speaker_name(), lora_scaling=_lora_scaling(run))


def _lora_scaling(run: Run) -> float | None:
    """The scale of the run's adapters (its saved config's alpha / rank), as export reads
    it; None when the config does not say (only a LoRA checkpoint then fails to load)."""
    model = run.config().get("model")
    try:
        return ModelConfig(**model).lora_scaling if isinstance(model, dict) else None
    except (TypeError, ValueError):  # a config from another version: not this one's fields
        return None


def reference_transcript(clip: Path) -> str | None:
    """What is said in `clip`, when the workspace knows it: the voice's prepared
    manifest (clips), a take's metadata (takes), or a same-named .txt beside it."""
    clip = Path(clip).expanduser()
    resolved = clip.resolve()
    voice = clip_voice(clip)
    if voice is not None:
        for entry in read_manifest(voice, usable_only=False, strict=False):
            if entry.get("path") and entry.get("text") \
                    and prepared_folder(voice).row_file(entry).resolve() == resolved:
                return str(entry["text"]).strip() or None
    for sidecar in (clip.with_suffix(".json"), clip.with_suffix(".txt")):
        if not sidecar.is_file() or sidecar == clip:
            continue
        try:
            raw = sidecar.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if sidecar.suffix == ".json":
            try:
                data = json.loads(raw)
            except ValueError:
                continue
            text = data.get("text") if isinstance(data, dict) else None
            if isinstance(text, str) and text.strip():
                return text.strip()
        elif raw.strip():
            return raw.strip()
    return None


def resolve_source(target: str | os.PathLike[str], *, checkpoint: str | None = None,
                   reference: str | os.PathLike[str] | None = None, speaker: str | None = None,
                   base: str | None = None, reference_text: str | None = None,
                   x_vector_only: bool = False) -> VoiceSource:
    """Turn MODEL_OR_VOICE (+ options) into a `VoiceSource`, or say clearly why not.

    With a reference clip: in-context cloning with `reference_text`, or with
    the transcript the workspace holds for that clip; x-vector only when no
    transcript is known or `x_vector_only`.
    """
    text = str(target).strip()
    ref = _checked_reference(text, reference, reference_text)
    path = Path(text).expanduser()
    if ref is not None:
        return _zero_shot_source(_zero_shot_base(path, text, base), ref, reference_text,
                                 x_vector_only)
    found = _folder_source(path, checkpoint, speaker, base)
    if found is not None:
        return found
    if path.is_dir():
        raise ModelError(f"{path} is not a model, voice, run or checkpoint folder.",
                         "Point to an exported model (with config.json), a voice folder, "
                         "or a run folder under <voice>/runs/.")
    if path.exists():
        raise ModelError(f"{path} is a file, not a model or voice folder.",
                         "Point to the folder that holds config.json.")
    model_dir = _resolve_model(text)  # a hub id, or a clear "does not exist"
    return _custom_voice_source(model_dir, _model_info(model_dir), speaker)


def _checked_reference(target: str, reference: str | os.PathLike[str] | None,
                       reference_text: str | None) -> Path | None:
    """The reference clip asked for (None: none), once the request is whole."""
    if not target:
        raise InputError("No voice or model was given.",
                         "Give a voice folder, a run folder, an exported model or a base model.")
    ref = Path(reference).expanduser() if reference else None
    if ref is not None and not ref.is_file():
        raise InputError(f"The reference clip {ref} does not exist.",
                         "Give a WAV/FLAC file of the speaker (5-15 seconds works well).")
    if reference_text is not None and ref is None:
        raise InputError("A reference text was given without a reference clip.",
                         "Give the clip with --reference, or drop --reference-text.")
    if reference_text is not None and not reference_text.strip():
        raise InputError("The reference text is empty.",
                         "Give what is said in the reference clip, or leave it out.")
    return ref


def _zero_shot_base(path: Path, target: str, base: str | None) -> Path:
    """The base model a zero-shot preview clones on: named directly, or through a voice
    or run (the base its runs trained from, as the window's Listen page reads it)."""
    if path.is_dir() and not is_model_folder(path):
        base_name = base or (Run(path).base_model() if holds_checkpoints(path)
                             else voice_base_model(path))
        if not base_name:
            raise InputError(f"{path} is not a model folder, and no base model is known "
                             "for it.", "Give the base model with --base.")
        model_dir = _resolve_model(base_name)
    else:
        model_dir = _resolve_model(target)
    info = _model_info(model_dir)
    if info.model_type != "base":
        raise ModelError(f"{model_dir.name} is a {info.model_type} model; a zero-shot "
                         "preview needs a base model.",
                         "Give a base model such as Qwen/Qwen3-TTS-12Hz-1.7B-Base.")
    return model_dir


def _zero_shot_source(model_dir: Path, ref: Path, reference_text: str | None,
                      x_vector_only: bool) -> VoiceSource:
    """A preview cloning `ref` on `model_dir`: in context with its words (given, else the
    workspace's), or from its speaker vector alone."""
    extra: dict[str, Any] = {}
    text = None
    if not x_vector_only:
        text = reference_text.strip() if reference_text else reference_transcript(ref)
        if text is None:
            # the synthesizer asks a recognizer when a good one is installed
            extra["transcribe"] = True
            extra["note"] = (f"No transcript is known for {ref.name}, so the preview clones "
                             "from its speaker vector only; give --reference-text for "
                             "in-context cloning, which sounds closer (or install a "
                             "Whisper model: it then transcribes the clip).")
    return VoiceSource(kind=VoiceKind.ZERO_SHOT, model_dir=model_dir, label="zero-shot",
                       reference=ref, reference_text=text, extra=extra)


def _folder_source(path: Path, checkpoint: str | None, speaker: str | None,
                   base: str | None) -> VoiceSource | None:
    """What a folder of the workspace speaks with: an adapter or instant voice, a
    checkpoint, a run, a model folder or a voice (None: not one of these)."""
    if is_adapter(path) and not checkpoint:
        return adapter_source(path, base)
    if path.is_dir() and path.name == INSTANT_DIR and not checkpoint:
        return instant_source(path.parent, base)  # the instant tier, named by its folder
    if path.is_dir() and step_of(path) is not None:
        return _checkpoint_source(run_of(path), str(path), base)  # best/ and held/ too
    if holds_checkpoints(path):
        return _checkpoint_source(path, checkpoint, base)
    if is_model_folder(path):
        if checkpoint:
            raise InputError(f"{path} is a model folder; --checkpoint needs a run or voice "
                             "folder.", "Pass the run folder (<voice>/runs/<run>) instead.")
        return _custom_voice_source(path, _model_info(path), speaker)
    if path.is_dir() and (is_voice_folder(path) or runs_dir(path).is_dir()
                          or exports_dir(path).is_dir()):
        return _voice_source(path, checkpoint, speaker, base)
    return None


def _voice_source(path: Path, checkpoint: str | None, speaker: str | None,
                  base: str | None) -> VoiceSource:
    """What `speak VOICE` speaks with: the checkpoint asked for, else the voice's best
    tier (its latest export, else adapter), else its latest run, else its instant voice."""
    if checkpoint:
        ckpt_path = Path(checkpoint).expanduser()
        if ckpt_path.is_dir() and step_of(ckpt_path) is not None:
            return _checkpoint_source(run_of(ckpt_path), str(ckpt_path), base)
        run = pick_run(path, with_checkpoint=True)
        if run is None:
            raise WorkspaceError(f"The voice {path.name} has no training run with a "
                                 "checkpoint.", "Train the voice first.")
        return _checkpoint_source(run.path, checkpoint, base)
    export = latest_export(path)
    if export is not None:
        return _custom_voice_source(export, _model_info(export), speaker, voice_dir=path)
    adapters = list_adapters(path)
    if adapters:
        return adapter_source(adapters[0], base)
    run = pick_run(path, with_checkpoint=True)
    if run is not None:
        return _checkpoint_source(run.path, None, base)
    if read_instant(path) is not None:
        return instant_source(path, base)
    raise WorkspaceError(f"The voice {path.name} has no trained model yet.",
                         "Train it first, or give --reference CLIP with a base model "
                         "for a zero-shot preview.")


def adapter_source(folder: Path, base: str | None = None) -> VoiceSource:
    """An adapter voice on its base (or `base`, which must be the same model)."""
    info = read_adapter_info(folder)
    base_name = base or info.get("base")
    if not base_name:
        raise ModelError(f"The adapter voice {folder.name} does not say its base model.",
                         "Export the run again with --adapter.")
    model_dir = _resolve_model(str(base_name))
    voice_dir = folder.parent.parent if folder.parent.name == EXPORTS_DIR else None
    return VoiceSource(kind=VoiceKind.ADAPTER, model_dir=model_dir, label=folder.name,
                       speaker=info.get("speaker") or None, voice_dir=voice_dir,
                       extra={"tier": Tier.ADAPTER, "adapter": str(folder)})


def trained_styles(source: VoiceSource) -> list[str]:
    """The style descriptions the voice was fine-tuned with ([]: none, or not a fine-tune):
    a run's data.json for a checkpoint, the export's or adapter voice's own record."""
    if source.kind == VoiceKind.CHECKPOINT and source.run_dir is not None:
        return styles_at(source.run_dir)
    if source.kind == VoiceKind.ADAPTER:
        return styles_at(Path(source.extra["adapter"]))
    if source.kind == VoiceKind.CUSTOM_VOICE:
        return styles_at(source.model_dir)
    return []


def styles_at(folder: Path) -> list[str]:
    """`trained_styles` of a run, checkpoint, adapter voice or export folder, read from its
    records alone (no model is resolved: a hub id is never looked up)."""
    if step_of(folder) is not None:
        folder = run_of(folder)  # a checkpoint (best/ and held/ too): its run's data
    if not (folder / EXPORT_INFO).is_file() and not is_adapter(folder):
        return Run(folder).trained_styles()
    info = read_adapter_info(folder) if is_adapter(folder) else read_json(folder / EXPORT_INFO)
    styles = info.get("styles") if isinstance(info, dict) else None
    return [str(s) for s in styles] if isinstance(styles, list) else []


#: the speaker slot Voxshard's fine-tunes fill in a Base model's codec embedding
FINE_TUNE_SPEAKER_ID = 3000


@dataclass(frozen=True)
class InstructNote:
    """Why an instruction given to a voice does little or nothing."""

    message: str
    #: dropped before speaking (else spoken with, to little effect)
    ignored: bool


def instruct_note(kind: VoiceKind, styles: list[str], size: str | None,
                  speaker_ids: list[int]) -> InstructNote | None:
    """What an instruction comes to with a voice of `kind` (a `VoiceSource` kind) trained
    with `styles`, on a model of `size` (`tts_model_size`) whose speaker slots are
    `speaker_ids`; None: the model takes it. The engine warns with it when it speaks, the
    window as soon as one is typed."""
    if kind == VoiceKind.ZERO_SHOT:
        return InstructNote("Base models take no instruction (the official voice clone has "
                            "none), so it is ignored.", ignored=True)
    if styles:
        return None  # fine-tuned with style descriptions: any size learnt to take them
    if "0b6" in str(size or ""):
        return InstructNote("0.6B models take no instruction (the official code drops it), "
                            "so it is ignored.", ignored=True)
    if kind in (VoiceKind.CHECKPOINT, VoiceKind.ADAPTER) or speaker_ids == [FINE_TUNE_SPEAKER_ID]:
        return InstructNote("This voice was fine-tuned from a Base model, which was never "
                            "trained on instructions: expect little or no effect.",
                            ignored=False)
    return None


def untrained_style_note(styles: list[str], instruct: str) -> str | None:
    """Why an instruction a voice trained with `styles` was not trained with works only in
    part (None: one of them, or a voice trained with none)."""
    if styles and instruct.strip() not in styles:
        return ("This voice was trained with the styles " + ", ".join(repr(s) for s in styles)
                + "; another instruction works only as far as it resembles them.")
    return None


def style_note(source: VoiceSource, instruct: str) -> str | None:
    """What speaking `source` with the instruction `instruct` comes to, in words, read from
    its records before any model loads (`instruct_note`, else `untrained_style_note`);
    None: it takes it."""
    own = {VoiceKind.CHECKPOINT: source.checkpoint, VoiceKind.CUSTOM_VOICE: source.model_dir,
           VoiceKind.ADAPTER: Path(str(source.extra.get("adapter") or source.model_dir))}
    note = folder_instruct_note(own.get(source.kind))
    if note is not None:
        return note.message
    return untrained_style_note(trained_styles(source), instruct)


def _config_at(name: str | None) -> dict[str, Any]:
    """config.json of a model named by a folder, {} for a hub id (not looked up)."""
    path = local_model_path(name) if name else None
    config = read_json(path / "config.json") if path is not None else None
    return config if isinstance(config, dict) else {}


def folder_instruct_note(folder: Path | None) -> InstructNote | None:
    """`instruct_note` of a checkpoint, run, adapter voice or export folder read from its
    records (None: a zero-shot or instant voice, which clones on a Base model)."""
    if folder is None:
        return instruct_note(VoiceKind.ZERO_SHOT, [], None, [])
    styles = styles_at(folder)
    base = ""
    if is_adapter(folder):
        base = str(read_adapter_info(folder).get("base") or "")
        kind, config = VoiceKind.ADAPTER, _config_at(base)
    elif (folder / EXPORT_INFO).is_file() or is_model_folder(folder):
        kind, config = VoiceKind.CUSTOM_VOICE, _config_at(str(folder))
    else:
        run = Run(run_of(folder) if step_of(folder) is not None else folder)
        base = run.base_model() or ""
        kind, config = VoiceKind.CHECKPOINT, _config_at(base)
    size = config.get("tts_model_size")
    if size is None and "0.6B" in base:
        size = "0b6"  # a hub id, not looked up: its name says the size
    ids = (config.get("talker_config") or {}).get("spk_id") or {}
    return instruct_note(kind, styles, size, [int(i) for i in ids.values()])


def adapter_of(source: VoiceSource) -> Any:
    """The adapter voice `source` names (its tensors unmerged, its speaker row), checked
    against the base it speaks on: another base refuses in one sentence."""
    voice = load_adapter(Path(source.extra["adapter"]))
    voice.check_base(source.model_dir)
    return voice


def instant_source(voice_dir: Path, base: str | None = None) -> VoiceSource:
    """The voice's instant tier: zero-shot (in-context) from its saved clip and words, on
    `base`, else the base it has (`instant_base`: recorded, or its runs'). A base given to
    an instant voice that records none is recorded (`record_instant_base`)."""
    instant = read_instant(voice_dir)
    if instant is None:
        raise WorkspaceError(f"The voice {voice_dir.name} has no instant voice.",
                             "Prepare the voice (it saves one), or run "
                             "`voxshard-engine voice instant VOICE --base MODEL`.")
    base_name = base or instant_base(voice_dir, instant)
    if not base_name:
        raise InputError(f"The instant voice of {voice_dir.name} does not say its base model.",
                         "Give the base model with --base.",
                         window_hint="Choose a base model in the Base field, then speak "
                                     "again.")
    model_dir = _resolve_model(base_name)
    if _model_info(model_dir).model_type != "base":
        raise ModelError(f"{model_dir.name} is not a base model, so it cannot speak the "
                         "instant voice.", "Give a base model with --base.",
                         window_hint="Choose a base model in the Base field.")
    if base and not instant.base:
        record_instant_base(voice_dir, base)
    return VoiceSource(kind=VoiceKind.ZERO_SHOT, model_dir=model_dir, label=Tier.INSTANT.value,
                       reference=instant.clip, reference_text=instant.text or None,
                       speaker=instant.speaker or None, voice_dir=voice_dir,
                       extra={"tier": Tier.INSTANT})


def _custom_voice_source(path: Path, info: Any, speaker: str | None,
                         voice_dir: Path | None = None) -> VoiceSource:
    if info.model_type == "base":
        raise ModelError(f"{path.name} is a base model with no trained voice in it.",
                         "Give --reference CLIP for a zero-shot preview, or speak with an "
                         "exported voice or a run.")
    if info.model_type != "custom_voice":
        raise ModelError(f"{path.name} is a {info.model_type} model, which Voxshard does not "
                         "speak with.", "Use an exported custom voice or a base model.")
    speakers = [s.lower() for s in info.speakers]
    if not speakers:
        raise ModelError(f"{path.name} has no speakers in its config.",
                         "Export the voice again.")
    name = (speaker or speakers[0]).lower()
    if name not in speakers:
        raise InputError(f"{path.name} has no speaker {speaker!r}.",
                         f"Its speakers: {', '.join(speakers)}.")
    return VoiceSource(kind=VoiceKind.CUSTOM_VOICE, model_dir=path, label=path.name, speaker=name,
                       voice_dir=voice_dir)


# -- loading ----------------------------------------------------------------------------------

def load_checkpoint_weights(model: Any, source: VoiceSource) -> list[str]:
    """Copy a run checkpoint's trained weights into `model` (official module tree).

    The tensors are `trained_weights`' (a LoRA run's adapters merged into the base
    model's weights with the run's own scale, as export merges them); frozen weights
    are not in a checkpoint and stay as loaded. Returns the names it replaced.
    """
    import torch  # noqa: PLC0415

    assert source.checkpoint is not None
    params = dict(model.named_parameters())
    weights = trained_weights(source.checkpoint, source.model_dir, source.lora_scaling,
                              shapes={n: tuple(p.shape) for n, p in params.items()})
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
    return sorted(weights)


def reference_audio(clip: Path) -> Any:
    """The reference clip as 24 kHz mono float32, checked long enough, ending with
    half a second of silence (`engine.synth.reference`)."""
    audio = read_mono(clip, SAMPLE_RATE)
    if audio.size < SAMPLE_RATE // 2:
        raise InputError(f"The reference clip {clip.name} is shorter than half a second.",
                         "Use 5-15 seconds of the speaker talking.")
    if audio.size > SAMPLE_RATE * 60:
        raise InputError(f"The reference clip {clip.name} is longer than a minute.",
                         "Use 5-15 seconds of the speaker talking.")
    return with_silent_tail(np.ascontiguousarray(audio, dtype=np.float32), SAMPLE_RATE)


def reference_x_vector(model: Any, clip: Path, audio: Any = None) -> Any:
    """Speaker-encoder x-vector of one clip (24 kHz mono), as the official clone prompt."""
    audio = reference_audio(clip) if audio is None else audio
    return model.extract_speaker_embedding(audio, SAMPLE_RATE)


def reference_codes(model: Any, audio: Any) -> Any:
    """The codec frames [T, 16] of 24 kHz reference audio (what in-context cloning continues)."""
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        return model.speech_tokenizer.encode(audio, sr=SAMPLE_RATE).audio_codes[0]


def voice_x_vector(model: Any, voice_dir: Path) -> Any:
    """The x-vector training put in the speaker slot for this voice.

    Code extraction saved it (engine.data.codes: the x-vector of the voice's
    chosen reference clip); that exact vector is used. A voice whose codes
    were never extracted gets it computed the same way, from the same choice
    of reference clip, with this model's speaker encoder.
    """
    import torch  # noqa: PLC0415

    try:
        index = load_codes_index(voice_dir)
        if index.x_vector_file is not None:
            return torch.from_numpy(index.x_vector())
    except VoxshardError:
        pass
    clip = reference_clip(voice_dir)
    if clip is None:
        raise WorkspaceError(f"The voice {voice_dir.name} has no usable prepared clip, so its "
                             "speaker vector cannot be computed.",
                             "Run `voxshard-engine voice prepare` on it first.")
    return reference_x_vector(model, clip)


def available_sources(voice_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What a voice folder can speak with, newest first within each kind (for pickers):
    exports, then the checkpoints of every run. Path logic only, no model loaded."""
    root = Path(voice_dir).expanduser()
    found: list[dict[str, Any]] = []
    for folder in list_exports(root):
        found.append({"kind": VoiceKind.CUSTOM_VOICE, "label": folder.name, "path": str(folder)})
    for run in reversed(list_runs(root)):
        for ckpt in reversed(run.checkpoints()):
            found.append({"kind": VoiceKind.CHECKPOINT, "label": f"{run.name} step {step_of(ckpt)}",
                          "path": str(ckpt), "run": run.name, "step": step_of(ckpt)})
    return found
