"""Speak: a loaded voice turns text into audio, chunk by chunk, fast.

`Synthesizer.load(source)` loads the model once; `speak()` can then be called
any number of times (the worker and the comparison reuse one instance).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.audio.timebase import SAMPLE_RATE
from engine.config.speak import SpeakOptions, audio_format
from engine.core.errors import (
    Cancelled,
    InputError,
    ModelError,
    SynthesisError,
    is_device_out_of_memory,
)
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.core.kinds import VoiceKind
from engine.model.checkpoint_weights import base_tensors
from engine.model.dtypes import gpu_half
from engine.model.loading import load_model
from engine.synth.decoding import DecodeSettings, FastTalker
from engine.synth.prompt import IclPrompt, build_prefill, instruct_ids, ref_text_ids
from engine.synth.reference_text import transcribed
from engine.synth.render import join_chunks, match_loudness, trim_silence, write_audio
from engine.synth.runaway import (
    RunawayGuard,
    cut_reasons,
    runaway_message,
    silence_codes,
    stop_reason,
)
from engine.synth.sampling import SamplerSettings
from engine.synth.stream import GrowingFile, StreamDecoder, expected_speech_s
from engine.synth.stream_render import StreamedRender
from engine.synth.voice import (
    InstructNote,
    VoiceSource,
    adapter_of,
    instruct_note,
    load_checkpoint_weights,
    reference_audio,
    reference_codes,
    reference_x_vector,
    trained_styles,
    untrained_style_note,
    voice_x_vector,
)
from engine.text import Chunk, split_text

_HARD_DEFAULTS = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9,
    "repetition_penalty": 1.05, "subtalker_dosample": True, "subtalker_top_k": 50,
    "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
}


@dataclass
class Speech:
    """What `speak` returns: the audio and how it was made."""

    audio: np.ndarray
    sample_rate: int
    seed: int
    chunks: list[dict[str, Any]]
    compute_s: float
    loudness_lufs: float | None
    cancelled: bool = False
    codes: list[Any] = field(default_factory=list, repr=False)
    #: seconds from the call to the first audio (streaming only)
    first_audio_s: float | None = None

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def rtf(self) -> float:
        """Real-time factor: seconds of audio per second of compute."""
        return self.duration_s / self.compute_s if self.compute_s > 0 else 0.0


def _speech(kept: list[tuple[Chunk, Any, np.ndarray]], seed: int, options: SpeakOptions,
            cancelled: bool, guard: RunawayGuard | None = None) -> Speech:
    """One text's finished render from its kept (chunk, codes, audio): joined with the
    chunks' pauses (none after the last), levelled; compute time is the caller's. A chunk
    the runaway `guard` cut says why (`runaway`: "loop", "silence" or None)."""
    pauses = [ch.pause_after_s for ch, _, _ in kept]
    if pauses:
        pauses[-1] = 0.0
    audio = join_chunks([w for _, _, w in kept], pauses, SAMPLE_RATE)
    audio, loudness = match_loudness(audio, options.loudness_lufs, SAMPLE_RATE)
    info = [{"index": ch.index, "text": ch.text, "frames": len(c),
             "max_frames": ch.max_frames, "seed": seed + ch.index,
             "capped": bool(len(c) >= ch.max_frames),
             "runaway": stop_reason(c[:, 0].tolist(), guard)} for ch, c, _ in kept]
    return Speech(audio=audio, sample_rate=SAMPLE_RATE, seed=seed, chunks=info, compute_s=0.0,
                  loudness_lufs=loudness, cancelled=cancelled, codes=[c for _, c, _ in kept])


def _emit_speed(emitter: Emitter, audio_s: float, compute_s: float) -> None:
    emitter.metric({"synth/rtf": round(audio_s / compute_s, 4) if compute_s > 0 else 0.0,
                    "synth/audio_s": round(audio_s, 3),
                    "synth/compute_s": round(compute_s, 3)})


def cpu_has_bf16() -> bool:
    """True when the CPU multiplies bf16 natively (AVX512-BF16 or AMX) and ATen runs
    its AVX-512 kernels: with ATEN_CPU_CAPABILITY=default or avx2 on such a CPU, bf16
    is emulated (slow), and CPU attention in bf16 fails outright in torch 2.13
    ("pack_vnni2 is only supported when avx512 is supported")."""
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as fh:
            flags = fh.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: Any, device: str | None,
                  capability: tuple[int, int] | None = None) -> Any:
    """The weight dtype to load with (see `Synthesizer.load`).

    The released weights are bf16. On a CPU with native bf16 math a bf16
    weight read costs half the memory traffic of fp32 and batched chunks cost
    little more than one (measured: 0.74 ms for one row of a 1024x3072 layer,
    0.86 ms for eight, against 0.93 / 1.97 ms in fp32), so auto picks bf16
    there; elsewhere fp32, because emulated bf16 is slow. On a GPU: bf16, or fp16
    below compute capability 8.0 (`capability`, default: the device's own).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = (dtype or "auto").lower()
    if name in ("float32", "fp32"):
        return torch.float32
    if name in ("bfloat16", "bf16"):
        return torch.bfloat16
    if name in ("float16", "fp16"):
        return torch.float16
    if name != "auto":
        raise InputError(f"Unknown dtype {dtype!r}.", "Use auto, float32, bfloat16 or float16.")
    on_gpu = (device or "").startswith("cuda") or (device is None and torch.cuda.is_available())
    if on_gpu:
        # the rule training uses: fp16 below compute capability 8.0, where bf16 is emulated
        if capability is None and torch.cuda.is_available():
            capability = torch.cuda.get_device_capability(device or None)
        return torch.bfloat16 if gpu_half(capability) == "bf16" else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def _files_stamp(folder: Path) -> str:
    """Which version of an adapter folder's files these are (a re-export replaces them):
    each file's inode, change time and size."""
    parts = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        try:
            st = path.stat()
        except OSError:
            continue
        parts.append(f"{path.name}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}")
    return ",".join(parts)


#: `Synthesizer.decode_audio`'s default: the current voice's in-context prompt
_DEFAULT_ICL: Any = object()


@dataclass(frozen=True)
class RowVoice:
    """What one row of a batch speaks as: its voice, speaker vector, in-context prompt
    (zero-shot with a transcript) and adapter slot (`adapters`; 0: the base alone). Voices
    of one base share a batch: each row carries its own."""

    source: VoiceSource
    speaker_vector: Any
    icl: Any = None
    adapter: int = 0


class Synthesizer:
    """One loaded model and the voices on it. Thread-safe for one speak() at a time (a
    lock guards it). `use_source` sets the voice it speaks by default; `add_voice` loads
    more voices of the same base beside it, by name, for the batcher's rows."""

    def __init__(self, wrapper: Any, source: VoiceSource, speaker_vector: Any,
                 quantize: str | None = None, fuse: bool = False) -> None:
        self.wrapper = wrapper
        self.model = wrapper.model
        # frozen: nothing derived from the weights (packed layers, prepared buffers,
        # captured graphs) carries autograd history or keeps activations for backward
        self.model.requires_grad_(False)
        self.processor = wrapper.processor
        self.source = source
        self.speaker_vector = speaker_vector
        self.fast = FastTalker(self.model, quantize=quantize, fuse=fuse)
        #: in-context cloning prompt (zero-shot with a transcript), else None
        self.icl: Any = None
        #: the default voice's adapter slot (0: none)
        self.adapter = 0
        #: voices loaded beside the default one (`add_voice`), by name
        self.voices: dict[str, RowVoice] = {}
        self._lock = threading.Lock()
        self._overwritten: set[str] = set()
        #: codebook-0 codes this model's codec gives silence (the runaway guard's), found
        #: at load: never on a request's thread beside the batch's GPU work
        self.silence = silence_codes(self.model)
        #: (reference codes, the codec's state after them): streaming's cache per voice
        self._primed_codec: tuple[Any, Any] | None = None

    # -- loading ----------------------------------------------------------------------------
    @classmethod
    def load(cls, source: VoiceSource, device: str | None = None, dtype: Any = None,
             on_event: EventCallback | Emitter | None = None, quantize: str | None = None,
             fuse: bool = False) -> Synthesizer:
        """Load `source`. `dtype`: a torch dtype, "float32", "bfloat16", or
        None/"auto" (bf16 on GPUs and on CPUs with native bf16 math, else fp32).
        `quantize="int8"`, `fuse`: faster CPU decoding that changes the numbers
        (quant.py); the default keeps exact parity with the official codes."""
        emitter = as_emitter(on_event)
        emitter.state("loading_model", detail=str(source.model_dir))
        wrapper = load_model(source.model_dir, device=device, dtype=resolve_dtype(dtype, device))
        synth = cls(wrapper, source, None, quantize=quantize, fuse=fuse)
        synth.use_source(source, on_event=emitter)
        if synth.fast.device.type == "cuda":
            # capture the common shape's frame graphs now: a cold `speak --play`
            # pays no capture (the bench's warm-up no longer hides that cost)
            synth.fast.prepare(synth.decode_settings(SpeakOptions()))
        return synth

    def use_source(self, source: VoiceSource,
                   on_event: EventCallback | Emitter | None = None) -> None:
        """Switch to another voice that shares this model's base weights (no reload).

        Used by the comparison and Listen: zero-shot, adapter voices and every checkpoint of
        a run all sit on one base model; only the trained tensors (a checkpoint), the
        adapter slot and the speaker vector change.
        """
        emitter = as_emitter(on_event)
        with self._lock:
            before = self.adapter
            if source.kind == VoiceKind.CHECKPOINT:
                assert source.checkpoint is not None
                if source.voice_dir is None:
                    raise ModelError(f"The run of {source.checkpoint} is not inside a voice "
                                     "folder, so its speaker vector is unknown.",
                                     "Keep runs under <voice>/runs/.")
                names = load_checkpoint_weights(self.model, source)
                if self._overwritten - set(names):
                    # the previous checkpoint trained tensors this one does not
                    # hold: they must go back to base values
                    self._restore_base()
                    names = load_checkpoint_weights(self.model, source)
                self._overwritten |= set(names)
                for gone in self.voices.values():  # they spoke on the base's weights,
                    self.fast.adapters.release(gone.adapter)  # changed now
                self.voices.clear()
                emitter.log(f"Loaded {len(names)} trained tensors from "
                            f"{source.checkpoint.name}.", level="debug")
                voice = RowVoice(source, voice_x_vector(self.model, source.voice_dir))
            else:
                voice = self._row_voice(source, emitter)  # a bad voice fails before any change
                if source.kind != VoiceKind.CUSTOM_VOICE:
                    self._restore_base()  # a checkpoint's tensors go back to the base's
            self.source, self.speaker_vector = voice.source, voice.speaker_vector
            self.icl, self.adapter = voice.icl, voice.adapter
            self.fast.adapters.release(before)  # the default voice's hold on it

    def _row_voice(self, source: VoiceSource, emitter: Emitter) -> RowVoice:
        """What `source` speaks as on this model, without changing the default voice."""
        if source.kind == VoiceKind.CUSTOM_VOICE:
            if source.model_dir != self.source.model_dir:
                raise InputError("A custom voice needs its own model; load it separately.")
            spk_id = self.model.config.talker_config.spk_id[source.speaker]
            embedding = self.model.talker.get_input_embeddings().weight
            return RowVoice(source, embedding[spk_id].detach().clone())
        if source.kind == VoiceKind.ZERO_SHOT:
            assert source.reference is not None
            audio = reference_audio(source.reference)  # bad clips fail before any change
            if source.extra.get("transcribe"):
                source = transcribed(source, emitter)
            icl = None
            if source.reference_text:
                icl = IclPrompt(ref_text_ids(self.processor, source.reference_text,
                                             self.fast.device),
                                reference_codes(self.model, audio).to(self.fast.device))
            vector = reference_x_vector(self.model, source.reference, audio)
            if source.extra.get("note"):
                emitter.log(str(source.extra["note"]), level="warning")
            return RowVoice(source, vector, icl)
        if source.kind == VoiceKind.ADAPTER:
            if source.model_dir != self.source.model_dir:
                raise InputError("An adapter voice of another base needs that base; "
                                 "load it separately.")
            stamp = _files_stamp(Path(source.extra["adapter"]))  # before the read: a
            adapter = adapter_of(source)  # rewrite during it is read again next time
            slot = self.fast.adapters.add(f"{adapter.folder}@{stamp}", adapter.tensors,
                                          adapter.scaling, adapter.folder.name)
            return RowVoice(source, adapter.x_vector, None, slot)
        raise InputError(f"Unknown voice kind {source.kind!r}.")

    def add_voice(self, name: str, source: VoiceSource,
                  on_event: EventCallback | Emitter | None = None) -> RowVoice:
        """Load voice `source` beside the others under `name` (replacing one of that name):
        an adapter voice takes a slot of the adapter pool, no model load; an instant
        (zero-shot) voice its speaker vector and prompt. Rows of every such voice share
        one batch (`BatchRequest.voice`)."""
        if source.kind == VoiceKind.CHECKPOINT or self._overwritten:
            raise InputError("A run's checkpoint changes the base model's own weights, so it "
                             "cannot speak beside other voices of that base.",
                             "Export it with --adapter: an adapter voice speaks beside them.")
        if source.model_dir != self.source.model_dir:
            raise InputError(f"The voice {name} speaks on {source.model_dir.name}, not on this "
                             f"model ({self.source.model_dir.name}).",
                             "Load it where its own base is loaded.")
        voice = self._row_voice(source, as_emitter(on_event))
        old = self.voices.get(name)
        self.voices[name] = voice
        if old is not None:
            self.fast.adapters.release(old.adapter)  # rows still speaking it hold their own
        return voice

    def remove_voice(self, name: str) -> bool:
        """Let voice `name` (`add_voice`) go: its adapter slot is free for the next voice
        once the rows still speaking it end. False: no voice of that name was loaded."""
        old = self.voices.pop(name, None)
        if old is not None:
            self.fast.adapters.release(old.adapter)
        return old is not None

    def voice(self, name: str | None) -> RowVoice:
        """Voice `name` (`add_voice`), or the default one (None)."""
        if name is None:
            return self.current_voice
        found = self.voices.get(name)
        if found is None:
            raise InputError(f"The voice {name!r} is not loaded here.",
                             "Send a voice request for it first.")
        return found

    @property
    def current_voice(self) -> RowVoice:
        return RowVoice(self.source, self.speaker_vector, self.icl, self.adapter)

    @contextmanager
    def speaking_as(self, voice: RowVoice | None) -> Iterator[None]:
        """Make `voice` the default one for the paths that speak it (a streamed request),
        then put the previous one back."""
        if voice is None:
            yield
            return
        before = self.current_voice
        self.source, self.speaker_vector = voice.source, voice.speaker_vector
        self.icl, self.adapter = voice.icl, voice.adapter
        try:
            yield
        finally:
            self.source, self.speaker_vector = before.source, before.speaker_vector
            self.icl, self.adapter = before.icl, before.adapter

    def _restore_base(self) -> None:
        """Put back the base values of every tensor a checkpoint overwrote (read from
        the base model's safetensors, so no second copy of the model sits in memory)."""
        if not self._overwritten:
            return
        params = dict(self.model.named_parameters())
        base = base_tensors(self.source.model_dir, self._overwritten)
        with torch.no_grad():
            for name, tensor in base.items():
                params[name].copy_(tensor.to(params[name].dtype))
        pending = self._overwritten - set(base)
        if pending:
            raise ModelError(f"The base model lacks {len(pending)} tensors the checkpoint "
                             "changed, so it cannot be restored.", "Load the voice again.")
        self._overwritten = set()

    # -- settings ---------------------------------------------------------------------------
    @property
    def languages(self) -> list[str]:
        ids = self.model.config.talker_config.codec_language_id or {}
        return sorted(k for k in ids if "dialect" not in k)

    def _language_id(self, language: str) -> int | None:
        lang = language.strip().lower()
        tc = self.model.config.talker_config
        ids = tc.codec_language_id or {}
        dialect = (tc.spk_is_dialect or {}).get(self.source.speaker or "", False)
        if dialect and lang in ("auto", "chinese") and dialect in ids:
            # official rule: a dialect speaker of a released CustomVoice model
            # speaks its dialect unless another language is asked for
            return int(ids[dialect])
        if lang == "auto":
            return None
        if lang not in ids or "dialect" in lang:
            known = ", ".join(["auto", *self.languages])
            raise InputError(f"This voice does not support the language {language!r}.",
                             f"Use one of: {known}.")
        return int(ids[lang])

    def decode_settings(self, options: SpeakOptions) -> Any:
        defaults = dict(_HARD_DEFAULTS)
        defaults.update({k: v for k, v in (self.wrapper.generate_defaults or {}).items()
                         if k in _HARD_DEFAULTS})

        def pick(value: Any, key: str) -> Any:
            return defaults[key] if value is None else value

        talker = SamplerSettings(
            do_sample=bool(pick(options.do_sample, "do_sample")),
            temperature=float(pick(options.temperature, "temperature")),
            top_k=int(pick(options.top_k, "top_k")),
            top_p=float(pick(options.top_p, "top_p")))
        predictor = SamplerSettings(
            do_sample=bool(pick(options.subtalker_do_sample, "subtalker_dosample")),
            temperature=float(pick(options.subtalker_temperature, "subtalker_temperature")),
            top_k=int(pick(options.subtalker_top_k, "subtalker_top_k")),
            top_p=float(pick(options.subtalker_top_p, "subtalker_top_p")))
        sync = 1 if self.fast.device.type == "cpu" else 8
        return DecodeSettings(talker=talker, predictor=predictor,
                              repetition_penalty=float(pick(options.repetition_penalty,
                                                            "repetition_penalty")),
                              sync_every=sync,
                              guard=RunawayGuard.of(options.runaway_loop_s,
                                                    options.runaway_silence_s, self.silence))

    def instruct_note(self, source: VoiceSource | None = None) -> InstructNote | None:
        """What an instruction comes to with this voice (None: the model takes it)."""
        source = source or self.source
        spk_ids = self.model.config.talker_config.spk_id or {}
        return instruct_note(source.kind, trained_styles(source),
                             str(getattr(self.model, "tts_model_size", "") or ""),
                             [int(i) for i in spk_ids.values()])

    def instruct_ids(self, options: SpeakOptions, emitter: Emitter,
                     source: VoiceSource | None = None) -> Any:
        """Token ids of `options.instruct` where the model takes one, else None (said why)."""
        source = source or self.source
        if not options.instruct:
            return None
        note = self.instruct_note(source)
        if note is not None:
            emitter.log(note.message, level="warning")
            if note.ignored:
                return None
        partly = untrained_style_note(trained_styles(source), options.instruct)
        if partly:
            emitter.log(partly, level="info")
        return instruct_ids(self.processor, options.instruct, self.fast.device)

    @staticmethod
    def _non_streaming(options: SpeakOptions) -> bool:
        # every voice: the layout training uses, and the one that keeps a clone's pace
        # (the official voice clone streams, QwenLM/Qwen3-TTS #239); None, from settings
        # saved when None meant "the official default", reads as the default
        return options.non_streaming is not False

    # -- speaking ---------------------------------------------------------------------------
    def generate_codes(self, chunks: list[Chunk], seeds: list[int], options: SpeakOptions,
                       emitter: Emitter, cancel: threading.Event | None,
                       on_batch: Callable[[list[int], list[Any]], None] | None = None,
                       in_order: bool = False,
                       on_codes: Callable[[list[int], int, Any], None] | None = None,
                       ) -> tuple[list[Any], bool]:
        """Codec frames for each chunk (seeded per chunk), `batch_size` chunks at a time.

        Batches take chunks of similar length (fewer wasted steps on rows that
        already ended) unless `in_order` (streaming: the first chunks first).
        A batch interrupted by `cancel` is dropped whole: only finished chunks
        come back. `on_batch(indices, codes)` sees each finished batch.
        """
        settings = self.decode_settings(options)
        language_id = self._language_id(options.language)
        non_streaming = self._non_streaming(options)
        instruct = self.instruct_ids(options, emitter)
        out: list[Any] = [None] * len(chunks)
        total_frames = sum(c.max_frames for c in chunks)
        done_chunks = 0
        cancelled = False
        order = list(range(len(chunks)))
        if not in_order:
            order.sort(key=lambda i: -chunks[i].max_frames)
        for start in range(0, len(order), options.batch_size):
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            picked = order[start:start + options.batch_size]
            rows = [chunks[i] for i in picked]
            prefill = build_prefill(self.model, self.processor, [c.text for c in rows],
                                    self.speaker_vector, language_id, non_streaming,
                                    icl=self.icl, instruct=instruct)
            limit = max(c.max_frames for c in rows)
            last = [0.0]

            def on_frame(n: int, picked: list[int] = picked, limit: int = limit,
                         last: list[float] = last) -> None:
                now = time.monotonic()
                if now - last[0] > 0.25 or n == limit:
                    last[0] = now
                    emitter.progress("frames", n, limit, chunks=picked, unit="frames",
                                     total_frames=total_frames)

            codes = self.fast.generate(
                prefill, [c.max_frames for c in rows], settings,
                seeds=[seeds[i] for i in picked], on_frame=on_frame,
                adapters=[self.adapter] * len(rows) if self.adapter else None,
                should_stop=(cancel.is_set if cancel is not None else None),
                on_codes=(None if on_codes is None
                          else lambda f, c, picked=picked: on_codes(picked, f, c)))
            if cancel is not None and cancel.is_set():
                cancelled = True  # this batch stopped mid-way: not speech anyone wants
                break
            for i, chunk, c in zip(picked, rows, codes, strict=True):
                out[i] = c
                done_chunks += 1
                if len(c) >= chunk.max_frames:
                    emitter.log(f"Chunk {i + 1} reached its length cap of {chunk.max_frames} "
                                "frames without ending; it was cut there.",
                                level="warning", chunk=i)
                reason = stop_reason(c[:, 0].tolist(), settings.guard)
                if reason is not None:
                    emitter.log(runaway_message(i + 1, reason, len(c)), level="warning",
                                chunk=i, runaway=reason)
                emitter.progress("chunks", done_chunks, len(chunks), chunk=i,
                                 text=chunk.text, frames=len(c))
            if on_batch is not None:
                on_batch(picked, codes)
        return out, cancelled

    def _generate(self, chunks: list[Chunk], seeds: list[int], options: SpeakOptions,
                  emitter: Emitter, cancel: threading.Event | None,
                  **hooks: Any) -> tuple[list[Any], bool]:
        """`generate_codes` as both ways of speaking end it: out of memory said in one
        sentence, and a cancelled render keeping the chunks it finished (`Cancelled`
        when it finished none)."""
        try:
            codes, cancelled = self.generate_codes(chunks, seeds, options, emitter, cancel,
                                                   **hooks)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one
            if is_device_out_of_memory(exc):
                raise SynthesisError("The device ran out of memory while speaking.",
                                     "Lower the batch size or use a smaller model.") from exc
            raise
        if cancelled:
            codes = [c if c is not None and len(c) else None for c in codes]
            if all(c is None for c in codes):
                raise Cancelled()
        return codes, cancelled

    def decode_audio(self, codes: list[Any], group: int = 8,
                     ref: Any = _DEFAULT_ICL) -> list[np.ndarray]:
        """Codec frames -> 24 kHz waveforms with the official decoder, `group` chunks
        per call (the decoder is causal, so padding a shorter chunk at its end does
        not change its samples beyond float rounding; batching halves the cost).
        `ref`: the in-context prompt the codes continue (a `RowVoice.icl`; by default the
        current voice's): its reference frames go in front of each chunk, then are cut."""
        tokenizer = self.model.speech_tokenizer
        waves: list[np.ndarray] = [np.zeros(0, dtype=np.float32) for _ in codes]
        todo = [i for i, c in enumerate(codes) if c is not None and len(c) > 0]
        icl = self.icl if ref is _DEFAULT_ICL else ref
        ref = None if icl is None else icl.ref_codes
        with torch.inference_mode():
            for start in range(0, len(todo), group):
                picked = todo[start:start + group]
                if ref is None:
                    items = [codes[i] for i in picked]
                else:
                    # in-context speech continues the reference: decode it with the
                    # reference frames in front, then cut them off (as the official call)
                    items = [torch.cat((ref.to(codes[i].device), codes[i])) for i in picked]
                wavs, _sr = tokenizer.decode([{"audio_codes": c} for c in items])
                for i, item, wav in zip(picked, items, wavs, strict=True):
                    wav = np.asarray(wav, dtype=np.float32)
                    if ref is not None:
                        wav = wav[int(len(ref) / max(len(item), 1) * wav.shape[0]):]
                    waves[i] = wav
        return waves

    def speak(self, text: str, options: SpeakOptions | None = None,
              on_event: EventCallback | Emitter | None = None,
              cancel: threading.Event | None = None,
              on_chunk: Callable[[int, np.ndarray], None] | None = None) -> Speech:
        """Render `text`; raises `Cancelled` if `cancel` is set before anything was made.
        `on_chunk(chunk_index, audio)`: see `speak_many`."""
        each = None if on_chunk is None else (lambda _t, i, audio: on_chunk(i, audio))
        return self.speak_many([text], options, on_event, cancel, on_chunk=each)[0]

    def speak_many(self, texts: list[str], options: SpeakOptions | None = None,
                   on_event: EventCallback | Emitter | None = None,
                   cancel: threading.Event | None = None,
                   on_chunk: Callable[[int, int, np.ndarray], None] | None = None,
                   ) -> list[Speech]:
        """Render several independent texts, their chunks batched together.

        Chunk i of every text uses seed + i, so a text sounds the same whether
        it is rendered alone or beside others (the comparison relies on it).
        `on_chunk(text_index, chunk_index, audio)` receives each chunk's audio
        (trimmed, loudness-matched) as soon as its batch is decoded, chunks
        then generated in text order: a player can start before the end.
        """
        options = options or SpeakOptions()
        emitter = as_emitter(on_event)
        split = [split_text(t, options.chunk_chars, options.sentence_pause_s,
                            options.paragraph_pause_s, max_frames=options.max_frames)
                 for t in texts]
        seed = options.seed if options.seed is not None else random.randrange(2**31)
        if options.language.strip().lower() != "auto" and self.source.kind != VoiceKind.ZERO_SHOT:
            emitter.log("Fine-tuned voices are trained without a language tag; "
                        "--language auto usually sounds closer to the recordings.",
                        level="warning")
        flat = [c for chunks in split for c in chunks]
        seeds = [seed + c.index for c in flat]
        guard = self.decode_settings(options).guard
        with self._lock:
            started = time.perf_counter()
            emitter.state("speaking", detail=f"{len(flat)} chunk(s)", chunks=len(flat))
            waves: list[np.ndarray | None] = [None] * len(flat)
            owner = [(t, c.index) for t, chunks in enumerate(split) for c in chunks]

            def decode_batch(picked: list[int], batch_codes: list[Any]) -> None:
                for i, wave in zip(picked, self.decode_audio(batch_codes), strict=True):
                    waves[i] = wave
                    if on_chunk is not None:
                        level, _ = match_loudness(trim_silence(wave, SAMPLE_RATE),
                                                  options.loudness_lufs, SAMPLE_RATE)
                        on_chunk(owner[i][0], owner[i][1], level)

            codes, cancelled = self._generate(flat, seeds, options, emitter, cancel,
                                              on_batch=decode_batch,
                                              in_order=on_chunk is not None)
            results: list[Speech] = []
            offset = 0
            for chunks in split:
                mine = zip(chunks, codes[offset:offset + len(chunks)],
                           waves[offset:offset + len(chunks)], strict=True)
                offset += len(chunks)
                results.append(_speech([(ch, c, w) for ch, c, w in mine
                                        if w is not None and c is not None],
                                       seed, options, cancelled, guard))
            compute = time.perf_counter() - started
        audio_s = sum(r.duration_s for r in results)
        for r in results:
            # one batch made them all: share the compute time by audio length
            r.compute_s = compute * (r.duration_s / audio_s) if audio_s > 0 else compute
        _emit_speed(emitter, audio_s, compute)
        return results

    def speak_stream(self, text: str, sink: Any, options: SpeakOptions | None = None,
                     on_event: EventCallback | Emitter | None = None,
                     cancel: threading.Event | None = None) -> Speech:
        """Speak `text` into `sink` (`stream.AudioSink`) while it is generated.

        Chunks are generated in text order; the first chunk's audio reaches the
        sink a few frames after generation starts, each later chunk follows
        after its pause. The sink gets the audio as the codec makes it (not
        trimmed or levelled: that needs the whole chunk); the returned `Speech`
        is the finished render, as `speak` makes it from the same audio.
        `Speech.first_audio_s`: seconds from the call to the first audio.
        """
        options = options or SpeakOptions()
        emitter = as_emitter(on_event)
        chunks = split_text(text, options.chunk_chars, options.sentence_pause_s,
                            options.paragraph_pause_s, max_frames=options.max_frames)
        seed = options.seed if options.seed is not None else random.randrange(2**31)
        started = time.perf_counter()
        decoder = self.model.speech_tokenizer.model.decoder
        primed = None
        if self.icl is not None:
            # the reference is decoded once per voice; every chunk continues from it
            cached = self._primed_codec
            if cached is None or cached[0] is not self.icl.ref_codes:
                cached = (self.icl.ref_codes, StreamDecoder.prime(decoder, self.icl.ref_codes))
                self._primed_codec = cached
            primed = cached[1]
        guard = self.decode_settings(options).guard
        render = StreamedRender(chunks, sink, decoder, primed, self.fast, guard, emitter,
                                started)
        with self._lock:
            emitter.state("speaking", detail=f"{len(chunks)} chunk(s)", chunks=len(chunks),
                          streaming=True)
            codes, cancelled = self._generate(
                chunks, [seed + c.index for c in chunks], options, emitter, cancel,
                on_batch=render.on_batch, in_order=True, on_codes=render.on_codes)
        speech = _speech([(ch, c, render.audio(ch.index))
                          for ch, c in zip(chunks, codes, strict=True) if c is not None],
                         seed, options, cancelled, guard)
        speech.compute_s = time.perf_counter() - started
        speech.first_audio_s = render.first_audio_s
        _emit_speed(emitter, speech.duration_s, speech.compute_s)
        return speech

    def speak_to_file(self, text: str, out: str | Path, options: SpeakOptions | None = None,
                      fmt: str | None = None, on_event: EventCallback | Emitter | None = None,
                      cancel: threading.Event | None = None,
                      stream: bool = False, play: Any = None) -> dict[str, Any]:
        """Render `text` into `out` (see `options.FORMATS`); returns a JSON-able summary.

        `stream`: `out` grows as the audio is generated (announced by an
        artifact event, role "speech_partial", at the first audio), and is
        replaced by the finished render (trimmed, levelled) at the end.
        `play`: also a sink (`stream.Player`) that hears it as it is made.
        """
        emitter = as_emitter(on_event)
        fmt = audio_format(str(out), fmt)
        target = Path(out)
        if stream or play is not None:

            if play is not None and hasattr(play, "expect"):
                opts = options or SpeakOptions()
                play.expect(expected_speech_s(split_text(text, opts.chunk_chars)))

            sinks: list[Any] = [] if play is None else [play]
            if stream:
                sinks.append(GrowingFile(target, fmt))
            announced = [False]

            class _Tee:
                def write(self, audio: np.ndarray) -> None:
                    for sink in sinks:
                        sink.write(audio)
                    if stream and not announced[0]:
                        announced[0] = True
                        emitter.artifact(str(target), role="speech_partial")

            try:
                speech = self.speak_stream(text, _Tee(), options, emitter, cancel)
            finally:
                for sink in sinks:
                    sink.close()
        else:
            speech = self.speak(text, options, emitter, cancel)
        path = write_audio(out, speech.audio, fmt, speech.sample_rate)
        emitter.artifact(str(path), role="speech")
        playback = play.stats() if play is not None and hasattr(play, "stats") else None
        if playback is not None:
            emitter.metric({f"play/{k}": v for k, v in playback.items() if v is not None})
        return {
            "playback": playback,
            "path": str(path), "format": fmt, "sample_rate": speech.sample_rate,
            "duration_s": round(speech.duration_s, 3), "compute_s": round(speech.compute_s, 3),
            "rtf": round(speech.rtf, 3), "seed": speech.seed, "chunks": speech.chunks,
            "loudness_lufs": (None if speech.loudness_lufs is None
                              else round(speech.loudness_lufs, 2)),
            "first_audio_s": (None if speech.first_audio_s is None
                              else round(speech.first_audio_s, 3)),
            "cancelled": speech.cancelled, "voice": self.source.to_dict(),
            # why chunks were cut short by the runaway guard ("loop", "silence"), if any
            "runaway": cut_reasons(speech.chunks),
        }
