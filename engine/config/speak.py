"""User-facing synthesis controls, validated once (no torch: the GUI builds these)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.config.schema import section
from engine.core.errors import InputError
from engine.text import DEFAULT_CHUNK_CHARS, MAX_CHUNK_CHARS

#: `--quantize` choices, faster CPU decoding that changes the numbers (quant.py): int8
#: weights with per-row int8 activations, or fp16 weights with fp32 activations
QUANT_MODES: tuple[str, ...] = ("int8", "fp16")

#: the longest runaway limit (the guard keeps this much of a row's recent codes)
RUNAWAY_MAX_S = 60.0

#: output formats by name; mp3 and opus only where the installed libsndfile
#: writes them (1.1+ for MP3, 1.0.29+ for Opus), see `available_formats`
FORMATS = ("wav", "flac", "ogg", "opus", "mp3")
#: file extensions that name a format
EXTENSIONS = {"wav": "wav", "wave": "wav", "flac": "flac", "ogg": "ogg", "oga": "ogg",
              "opus": "opus", "mp3": "mp3"}


def _check(cond: bool, message: str, hint: str | None = None) -> None:
    if not cond:
        raise InputError(message, hint)


@section("speak")
@dataclass(frozen=True)
class SpeakOptions:
    """How to speak. `None` means "the model's own default" (its generation_config.json)."""

    #: randomness of codebook 0 (rhythm, intonation); lower is steadier
    temperature: float | None = None
    #: sample only among the k most likely codes (0 = no limit)
    top_k: int | None = None
    #: sample only within this cumulative probability (1 = no limit)
    top_p: float | None = None
    #: > 1 discourages repeating codes (stops stuck, droning output)
    repetition_penalty: float | None = None
    #: False: always take the most likely code (deterministic, flatter)
    do_sample: bool | None = None
    #: the same controls for codebooks 1..15 (timbre detail)
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None
    subtalker_do_sample: bool | None = None
    #: base seed; chunk i uses seed + i, so any chunk can be re-rendered alone.
    #: None picks one at random and reports it.
    seed: int | None = None
    #: "auto" or one of the model's languages (fine-tuned voices: keep "auto")
    language: str = "auto"
    #: soft limit of characters per chunk of long text
    chunk_chars: int = DEFAULT_CHUNK_CHARS
    #: hard cap on codec frames per chunk (12.5 per second); None: from text length
    max_frames: int | None = None
    #: a chunk whose codes repeat in a loop (a drone, a word said again and again) for
    #: this many seconds ends there, reported as cut (0: never)
    runaway_loop_s: float = 4.0
    #: a chunk that stays silent for this many seconds ends there, reported as cut (0: never)
    runaway_silence_s: float = 5.0
    #: silence between sentences / paragraphs, seconds
    sentence_pause_s: float = 0.3
    paragraph_pause_s: float = 0.6
    #: integrated loudness of the output in LUFS; None leaves the level alone
    loudness_lufs: float | None = -20.0
    #: chunks generated together (each weight read serves all of them; on a CPU
    #: eight cost about twice one, on a GPU about the same)
    batch_size: int = 8
    #: the whole text in the prompt before speech starts (every voice's default), or
    #: off: one text token fed per frame as speech goes (the official voice clone's
    #: default), which hurries speech toward about 195 words a minute whatever the
    #: reference's own pace (QwenLM/Qwen3-TTS #239)
    non_streaming: bool = True
    #: style instruction for models that take one (released 1.7B CustomVoice);
    #: ignored, with a warning, where it has no effect
    instruct: str | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "subtalker_temperature"):
            v = getattr(self, name)
            _check(v is None or 0 < v <= 5, f"{name} must be between 0 and 5 (got {v}).")
        for name in ("top_k", "subtalker_top_k"):
            v = getattr(self, name)
            _check(v is None or 0 <= v <= 4096, f"{name} must be between 0 and 4096 (got {v}).")
        for name in ("top_p", "subtalker_top_p"):
            v = getattr(self, name)
            _check(v is None or 0 < v <= 1, f"{name} must be in (0, 1] (got {v}).")
        rp = self.repetition_penalty
        _check(rp is None or 0.5 <= rp <= 3, f"repetition_penalty must be between 0.5 and 3 "
               f"(got {rp}).")
        _check(self.seed is None or 0 <= self.seed < 2**63, "seed must be a non-negative integer.")
        _check(20 <= self.chunk_chars <= MAX_CHUNK_CHARS,
               f"chunk_chars must be between 20 and {MAX_CHUNK_CHARS} (got {self.chunk_chars}).")
        _check(self.max_frames is None or 2 <= self.max_frames <= 8192,
               f"max_frames must be between 2 and 8192 (got {self.max_frames}).")
        for name in ("runaway_loop_s", "runaway_silence_s"):
            v = getattr(self, name)
            _check(0 <= v <= RUNAWAY_MAX_S, f"{name} must be between 0 (off) and "
                   f"{RUNAWAY_MAX_S:g} seconds (got {v}).")
        _check(0 <= self.sentence_pause_s <= 5 and 0 <= self.paragraph_pause_s <= 5,
               "pauses must be between 0 and 5 seconds.")
        _check(self.loudness_lufs is None or -70 < self.loudness_lufs < 0,
               f"loudness_lufs must be between -70 and 0 (got {self.loudness_lufs}).")
        _check(1 <= self.batch_size <= 64, f"batch_size must be between 1 and 64 "
               f"(got {self.batch_size}).")
        _check(bool(self.language and self.language.strip()), "language must not be empty.",
               "Use 'auto' to let the model decide.")
        _check(self.instruct is None or len(self.instruct) <= 2000,
               "instruct must be at most 2000 characters.")

    def replace(self, **changes: Any) -> SpeakOptions:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeakOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        _check(not unknown, f"Unknown speech option(s): {', '.join(unknown)}.",
               f"Known options: {', '.join(sorted(known))}.")
        try:
            return cls(**data)
        except TypeError as exc:
            raise InputError(f"Bad speech options: {exc}.") from exc


def available_formats() -> tuple[str, ...]:
    """The formats this machine can write (asks libsndfile; WAV/FLAC/OGG always)."""
    try:
        import soundfile as sf
    except (ImportError, OSError):
        return FORMATS[:3]
    found = []
    for fmt in FORMATS:
        container, subtype = {"opus": ("OGG", "OPUS"), "mp3": ("MP3", "MPEG_LAYER_III")}.get(
            fmt, (fmt.upper(), None))
        if subtype is None or subtype in sf.available_subtypes(container):
            found.append(fmt)
    return tuple(found)


def audio_format(path: str, requested: str | None) -> str:
    """The output format: `requested`, else the file extension (none: WAV).

    An extension that names no format is an error, never a WAV under a
    misleading name.
    """
    if requested:
        fmt = requested.lower().lstrip(".")
        fmt = EXTENSIONS.get(fmt, fmt)
    else:
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        suffix = name.rsplit(".", 1)[-1].lower() if "." in name.lstrip(".") else ""
        if not suffix:
            return "wav"
        _check(suffix in EXTENSIONS, f"The output name {name!r} ends in .{suffix}, which is "
               "not an audio format Voxshard writes.",
               f"Use one of: {', '.join('.' + e for e in sorted(set(EXTENSIONS)))}, "
               "or give --format.")
        fmt = EXTENSIONS[suffix]
    _check(fmt in FORMATS, f"Audio format {fmt!r} is not supported.",
           f"Use one of: {', '.join(FORMATS)}.")
    _check(fmt in available_formats(), f"This machine's libsndfile cannot write {fmt}.",
           f"Use one of: {', '.join(available_formats())} (or upgrade libsndfile).")
    return fmt
