"""User-facing synthesis controls, validated once (no torch: the GUI builds these)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.config.schema import SettingError, check, refuse_unknown, section, setting
from engine.core.errors import InputError
from engine.text import DEFAULT_CHUNK_CHARS, MAX_CHUNK_CHARS

#: `--quantize` choices, faster CPU decoding that changes the numbers (quant.py): int8
#: weights with per-row int8 activations, or fp16 weights with fp32 activations
QUANT_MODES: tuple[str, ...] = ("int8", "fp16")

#: `--dtype` choices, the weight precision a voice speaks in (auto: bf16 on GPUs and
#: bf16-capable CPUs)
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16")

#: the longest style instruction, in characters
MAX_INSTRUCT = 2000

#: the longest runaway limit (the guard keeps this much of a row's recent codes)
RUNAWAY_MAX_S = 60.0

#: the audio files Voxshard writes, by name: libsndfile's container and subtype for each
#: (renders, streams, the speech server's responses, a book's WAV and FLAC); mp3 and opus
#: only where the installed libsndfile writes them (1.1+ for MP3, 1.0.29+ for Opus), see
#: `available_formats`
SOUNDFILE_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"),
                     "ogg": ("OGG", "VORBIS"), "opus": ("OGG", "OPUS"),
                     "mp3": ("MP3", "MPEG_LAYER_III")}
FORMATS = tuple(SOUNDFILE_FORMATS)
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

    #: randomness of codebook 0 (rhythm, intonation): lower is steadier, higher livelier
    temperature: float | None = setting(None, label="Temperature", above=0, at_most=5)
    #: sample only among the k most likely codes (0 = no limit)
    top_k: int | None = setting(None, label="Top-k", at_least=0, at_most=4096)
    #: sample only within this cumulative probability (1 = no limit)
    top_p: float | None = setting(None, label="Top-p", above=0, at_most=1)
    #: > 1 discourages repeating codes (stops stuck, droning output)
    repetition_penalty: float | None = setting(None, at_least=0.5, at_most=3)
    #: sample codebook 0 (on), or always take its most likely code (off: deterministic,
    #: flatter); not given: the model's own
    do_sample: bool | None = None
    #: randomness of codebooks 1..15 (timbre detail), as temperature is of codebook 0
    subtalker_temperature: float | None = setting(None, above=0, at_most=5)
    #: codebooks 1..15 sample only among the k most likely codes (0 = no limit)
    subtalker_top_k: int | None = setting(None, at_least=0, at_most=4096)
    #: codebooks 1..15 sample only within this cumulative probability (1 = no limit)
    subtalker_top_p: float | None = setting(None, above=0, at_most=1)
    #: sample codebooks 1..15 (on), or take their most likely codes (off); not given: the
    #: model's own
    subtalker_do_sample: bool | None = None
    #: base seed: the same seed and text give the same audio; chunk i uses seed + i, so
    #: any chunk can be re-rendered alone. None picks one at random and reports it.
    seed: int | None = setting(None, label="Seed", at_least=0, below=2**63)
    #: "auto" or one of the model's languages (fine-tuned voices: keep "auto")
    language: str = "auto"
    #: soft limit of characters per chunk of long text
    chunk_chars: int = setting(DEFAULT_CHUNK_CHARS, at_least=20, at_most=MAX_CHUNK_CHARS)
    #: hard cap on codec frames per chunk (12.5 per second); None: from text length
    max_frames: int | None = setting(None, at_least=2, at_most=8192)
    #: a chunk whose codes repeat in a loop (a drone, a word said again and again) for
    #: this many seconds ends there, reported as cut (0: never)
    runaway_loop_s: float = setting(4.0, unit="s", at_least=0, at_most=RUNAWAY_MAX_S)
    #: a chunk that stays silent for this many seconds ends there, reported as cut (0: never)
    runaway_silence_s: float = setting(5.0, unit="s", at_least=0, at_most=RUNAWAY_MAX_S)
    #: silence between the sentences of a paragraph, seconds
    sentence_pause_s: float = setting(0.3, unit="s", at_least=0, at_most=5)
    #: silence between paragraphs (a blank line in the text), seconds
    paragraph_pause_s: float = setting(0.6, unit="s", at_least=0, at_most=5)
    #: integrated loudness of the output in LUFS; None leaves the level alone
    loudness_lufs: float | None = setting(-20.0, unit="LUFS", flag="--loudness", above=-70,
                                          below=0)
    #: chunks generated together (each weight read serves all of them; on a CPU
    #: eight cost about twice one, on a GPU about the same)
    batch_size: int = setting(8, at_least=1, at_most=64,
                              http=False)  # the speech server's --rows sizes its batches
    #: the whole text in the prompt before speech starts (every voice's default), or
    #: off: one text token fed per frame as speech goes (the official voice clone's
    #: default), which hurries speech toward about 195 words a minute whatever the
    #: reference's own pace (QwenLM/Qwen3-TTS #239)
    non_streaming: bool = True
    #: style instruction for models that take one (released 1.7B CustomVoice);
    #: ignored, with a warning, where it has no effect
    instruct: str | None = setting(None, label="Style")

    def __post_init__(self) -> None:
        try:
            check(self)  # each field's bounds, from its `setting`
        except SettingError as exc:  # the setting as data: each surface names it its way
            raise exc.as_input() from exc
        _check(bool(self.language and self.language.strip()), "language must not be empty.",
               "Use 'auto' to let the model decide.")
        _check(self.instruct is None or len(self.instruct) <= MAX_INSTRUCT,
               f"instruct must be at most {MAX_INSTRUCT} characters.")

    def replace(self, **changes: Any) -> SpeakOptions:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeakOptions:
        refuse_unknown(cls, data, "speech option", "options")
        try:
            return cls(**data)
        except TypeError as exc:
            raise InputError(f"Bad speech options: {exc}.") from exc


#: the speaking settings `speak` and `compare` take as flags (their words, type and bounds
#: from the field), the API's `speak` keywords among them; a setting not given is the
#: field's default, or the model's own where that is None
SPEAK_SETTINGS: tuple[str, ...] = (
    "speak.seed", "speak.temperature", "speak.top_k", "speak.top_p",
    "speak.repetition_penalty", "speak.language", "speak.chunk_chars", "speak.max_frames",
    "speak.runaway_loop_s", "speak.runaway_silence_s", "speak.batch_size",
    "speak.loudness_lufs", "speak.non_streaming", "speak.instruct", "speak.do_sample",
    "speak.subtalker_temperature", "speak.subtalker_top_k", "speak.subtalker_top_p",
    "speak.subtalker_do_sample", "speak.sentence_pause_s", "speak.paragraph_pause_s",
)


def available_formats() -> tuple[str, ...]:
    """The formats this machine can write (asks libsndfile; WAV/FLAC/OGG always)."""
    try:
        import soundfile as sf  # noqa: PLC0415
    except (ImportError, OSError):
        return FORMATS[:3]
    return tuple(fmt for fmt, (container, subtype) in SOUNDFILE_FORMATS.items()
                 if subtype in sf.available_subtypes(container))


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
