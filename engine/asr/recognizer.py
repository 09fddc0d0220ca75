"""Speech recognition (ASR): one interface, three backends.

- ``pocketsphinx``: offline, its wheel ships an English model; low accuracy
  (about 0.2 WER on clean synthetic speech), English only. The fallback, and
  what the tests use.
- ``faster-whisper``: a CTranslate2 Whisper folder (such as the
  ``Systran/faster-whisper-*`` models); language detection, word timestamps.
  The best choice for real use (optional extra: ``pip install faster-whisper``).
- ``transformers``: a plain ``openai/whisper-*`` folder through the
  transformers library (already installed for the TTS model).

`load_recognizer(spec)` picks one. `spec` is ``"pocketsphinx"``, ``"auto"``
(a Whisper model found in the Hugging Face cache, else pocketsphinx), a
local folder, or a hub id (looked up in the local cache only: this never
downloads; a missing model is one sentence on how to get it). The
environment variable ``VOXSHARD_ASR`` sets what ``"auto"`` means.

Every backend takes 16 kHz mono float32 audio and returns a `Transcript`
(text, words with times where the backend gives them, language, compute time).
Loading is lazy and the heavy libraries are imported inside the backends.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from engine.audio.io import BadAudioFile, decode
from engine.audio.resample import resample
from engine.core.errors import AudioError, InputError, ModelError
from engine.layout.voice import display_path
from engine.model.loading import HUB_ID, default_device
from engine.text import tidy_text

SAMPLE_RATE = 16000
ENV_VAR = "VOXSHARD_ASR"
#: looked for, in this order, in the Hugging Face cache when the spec is "auto"
KNOWN_WHISPER_MODELS = (
    "Systran/faster-whisper-large-v3", "Systran/faster-whisper-medium",
    "Systran/faster-whisper-medium.en", "Systran/faster-whisper-small",
    "Systran/faster-whisper-small.en", "Systran/faster-whisper-base",
    "Systran/faster-whisper-base.en", "Systran/faster-whisper-tiny",
    "Systran/faster-whisper-tiny.en", "deepdml/faster-whisper-large-v3-turbo-ct2",
    "openai/whisper-large-v3-turbo", "openai/whisper-large-v3", "openai/whisper-medium",
    "openai/whisper-small", "openai/whisper-base", "openai/whisper-tiny",
)
SUGGESTED_MODEL = "Systran/faster-whisper-small"
#: Whisper language codes for the language names a voice uses
LANGUAGE_CODES = {
    "english": "en", "chinese": "zh", "german": "de", "spanish": "es", "russian": "ru",
    "korean": "ko", "french": "fr", "japanese": "ja", "portuguese": "pt", "turkish": "tr",
    "polish": "pl", "catalan": "ca", "dutch": "nl", "arabic": "ar", "swedish": "sv",
    "italian": "it", "indonesian": "id", "hindi": "hi", "finnish": "fi", "vietnamese": "vi",
    "hebrew": "he", "ukrainian": "uk", "greek": "el", "malay": "ms", "czech": "cs",
    "romanian": "ro", "danish": "da", "hungarian": "hu", "norwegian": "no", "thai": "th",
}


@dataclass(frozen=True)
class Word:
    text: str
    start_s: float
    end_s: float

    def to_list(self) -> list[Any]:
        return [self.text, round(self.start_s, 3), round(self.end_s, 3)]


@dataclass
class Transcript:
    """What a recogniser heard in one piece of audio."""

    text: str
    words: list[Word] = field(default_factory=list)
    language: str | None = None
    backend: str = ""
    duration_s: float = 0.0
    compute_s: float = 0.0
    #: mean word probability where the backend gives one (Whisper), else None
    confidence: float | None = None

    @property
    def rtf(self) -> float:
        """Seconds of audio per second of compute (above 1: faster than real time)."""
        return self.duration_s / self.compute_s if self.compute_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "words": [w.to_list() for w in self.words],
                "language": self.language, "backend": self.backend,
                "duration_s": round(self.duration_s, 3), "compute_s": round(self.compute_s, 3),
                "confidence": None if self.confidence is None else round(self.confidence, 3)}


class Recognizer(Protocol):
    #: "pocketsphinx" | "faster-whisper" | "transformers"
    backend: str
    #: model id or folder (what a report names)
    model: str

    def transcribe(self, audio: np.ndarray, language: str | None = None) -> Transcript:
        """`audio`: 16 kHz mono float32. `language`: a voice language name or code, or None."""
        ...


def language_code(language: str | None) -> str | None:
    """Whisper's code for a voice language ("english" -> "en"); None for auto/unknown."""
    if not language:
        return None
    lang = language.strip().lower()
    if lang in ("", "auto"):
        return None
    if lang in LANGUAGE_CODES.values():
        return lang
    return LANGUAGE_CODES.get(lang)


def _timed(backend: str, audio: np.ndarray, fn: Any) -> Transcript:
    started = time.perf_counter()
    out: Transcript = fn()
    out.compute_s = time.perf_counter() - started
    out.duration_s = len(audio) / SAMPLE_RATE
    out.backend = backend
    out.text = tidy_text(out.text)
    return out


# -- pocketsphinx ------------------------------------------------------------------------------

class PocketsphinxRecognizer:
    """CMU pocketsphinx with the English model inside its wheel (offline, low accuracy)."""

    backend = "pocketsphinx"
    model = "pocketsphinx en-us"
    #: pocketsphinx's frame rate (frames per second)
    FRAME_RATE = 100

    def __init__(self) -> None:
        try:
            from pocketsphinx import Decoder  # noqa: PLC0415
        except ImportError as exc:
            raise ModelError("The offline speech recogniser needs the pocketsphinx package.",
                             "Install it with `pip install pocketsphinx`.") from exc
        # a narrower search (fewer active HMMs and word exits per frame): the same word
        # error rate on clean speech (0.20 on piper sentences), 1.7x faster there and
        # 3.5x faster on noise, which an untrained model produces (measured on 2 cores)
        self._decoder = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL", maxhmmpf=2000,
                                maxwpf=5)
        self._lock = threading.Lock()

    def transcribe(self, audio: np.ndarray, language: str | None = None) -> Transcript:
        code = language_code(language)
        if code not in (None, "en"):
            raise InputError(f"pocketsphinx recognises English only, not {language!r}.",
                             f"Use a Whisper model: {{read.asr}} {SUGGESTED_MODEL}.")

        def run() -> Transcript:
            pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()
            with self._lock:
                d = self._decoder
                d.start_utt()
                d.process_raw(pcm, full_utt=True)
                d.end_utt()
                hyp = d.hyp()
                segs = list(d.seg()) if hyp is not None else []
            words = []
            for s in segs:
                w = re.sub(r"\(\d+\)$", "", s.word)
                if w.startswith(("<", "[")):
                    continue
                words.append(Word(w, s.start_frame / self.FRAME_RATE,
                                  (s.end_frame + 1) / self.FRAME_RATE))
            return Transcript(" ".join(w.text for w in words), words, "en")

        return _timed(self.backend, audio, run)


# -- faster-whisper (CTranslate2) ---------------------------------------------------------------

class FasterWhisperRecognizer:
    backend = "faster-whisper"

    def __init__(self, folder: Path, model: str, device: str | None = None) -> None:
        try:
            from faster_whisper import WhisperModel  # noqa: PLC0415
        except ImportError as exc:
            raise ModelError(f"{model} is a CTranslate2 Whisper model, which needs the "
                             "faster-whisper package.",
                             "Install it with `pip install faster-whisper`, or give a plain "
                             "openai/whisper-* model.") from exc
        self.model = model
        dev = "cuda" if (device or "").startswith("cuda") else ("cpu" if device else "auto")
        compute = "default"
        if dev in ("cpu", "auto") and not _cuda_available():
            dev, compute = "cpu", "int8"
        try:
            self._model = WhisperModel(str(folder), device=dev, compute_type=compute,
                                       cpu_threads=int(os.environ.get("OMP_NUM_THREADS", "0")
                                                       or 0))
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelError(f"Could not load the Whisper model in {folder}: {exc}.",
                             "The folder may be damaged; download it again.") from exc
        self._lock = threading.Lock()

    def transcribe(self, audio: np.ndarray, language: str | None = None) -> Transcript:
        def run() -> Transcript:
            with self._lock:
                segments, info = self._model.transcribe(
                    np.ascontiguousarray(audio, dtype=np.float32),
                    language=language_code(language), word_timestamps=True, beam_size=5,
                    condition_on_previous_text=False)
                segments = list(segments)
            words = [Word(w.word.strip(), float(w.start), float(w.end))
                     for s in segments for w in (s.words or []) if w.word.strip()]
            text = " ".join(s.text.strip() for s in segments)
            probs = [float(w.probability) for s in segments for w in (s.words or [])]
            return Transcript(text, words, getattr(info, "language", None),
                              confidence=float(np.mean(probs)) if probs else None)

        return _timed(self.backend, audio, run)


# -- transformers Whisper ------------------------------------------------------------------------

class TransformersWhisperRecognizer:
    backend = "transformers"
    #: Whisper's window: 30 s of audio per decoding pass
    WINDOW_S = 30.0

    def __init__(self, folder: Path, model: str, device: str | None = None) -> None:
        import torch  # noqa: PLC0415
        from transformers import WhisperForConditionalGeneration, WhisperProcessor  # noqa: PLC0415

        self.model = model
        self.device = device or default_device()
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        try:
            self._processor = WhisperProcessor.from_pretrained(str(folder))
            self._model = WhisperForConditionalGeneration.from_pretrained(
                str(folder), dtype=dtype).to(self.device).eval()
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelError(f"Could not load the Whisper model in {folder}: {exc}.",
                             "The folder may be damaged; download it again.") from exc
        self._dtype = dtype
        self._lock = threading.Lock()

    def _windows(self, audio: np.ndarray) -> list[tuple[int, np.ndarray]]:
        step = int(self.WINDOW_S * SAMPLE_RATE)
        if len(audio) <= step:
            return [(0, audio)]
        return [(s, audio[s:s + step]) for s in range(0, len(audio), step)]

    def transcribe(self, audio: np.ndarray, language: str | None = None) -> Transcript:
        import torch  # noqa: PLC0415

        def run() -> Transcript:
            texts: list[str] = []
            words: list[Word] = []
            detected: str | None = language_code(language)
            gen = self._model.generation_config
            multilingual = bool(getattr(gen, "is_multilingual", False)
                                and getattr(gen, "lang_to_id", None))
            with self._lock, torch.inference_mode():
                for offset, piece in self._windows(audio):
                    feats = self._processor.feature_extractor(
                        piece, sampling_rate=SAMPLE_RATE, return_tensors="pt"
                    ).input_features.to(self.device, self._dtype)
                    kwargs: dict[str, Any] = {}
                    if multilingual:
                        if detected is None:
                            detected = self._detect(feats)
                        kwargs = {"language": detected, "task": "transcribe"}
                    timed = getattr(gen, "alignment_heads", None) is not None
                    out = self._model.generate(feats, return_token_timestamps=timed, **kwargs)
                    seq = out["sequences"] if timed else out
                    text = self._processor.batch_decode(seq, skip_special_tokens=True)[0]
                    texts.append(text)
                    if timed:
                        words += self._words(seq[0], out["token_timestamps"][0],
                                             offset / SAMPLE_RATE)
            return Transcript(" ".join(t.strip() for t in texts), words, detected)

        return _timed(self.backend, audio, run)

    def _detect(self, feats: Any) -> str | None:
        try:
            ids = self._model.detect_language(feats)
        except (ValueError, RuntimeError, AttributeError):
            return None
        token = self._processor.tokenizer.convert_ids_to_tokens(int(ids.reshape(-1)[0]))
        m = re.fullmatch(r"<\|([a-z]{2,3}(?:-[A-Za-z]+)?)\|>", token or "")
        return m.group(1) if m else None

    def _words(self, ids: Any, times: Any, offset_s: float) -> list[Word]:
        """Words from token timestamps: a token starting with a space starts a word."""
        tok = self._processor.tokenizer
        out: list[Word] = []
        current, start, end = "", 0.0, 0.0
        pairs = [(int(i), float(t)) for i, t in zip(ids.tolist(), times.tolist(), strict=False)]
        for k, (i, t) in enumerate(pairs):
            piece = tok.decode([i], skip_special_tokens=True)
            if not piece:
                continue  # start of transcript, language, task, timestamps
            t_end = pairs[k + 1][1] if k + 1 < len(pairs) else t
            if piece.startswith(" ") and current:
                out.append(Word(current.strip(), offset_s + start, offset_s + end))
                current = ""
            if not current:
                start = t
            current += piece
            end = t_end
        if current.strip():
            out.append(Word(current.strip(), offset_s + start, offset_s + end))
        return out


# -- choosing one ----------------------------------------------------------------------------------

def _cuda_available() -> bool:
    try:
        import ctranslate2  # noqa: PLC0415

        return ctranslate2.get_cuda_device_count() > 0
    except (ImportError, RuntimeError):
        return False


def model_kind(folder: Path) -> str | None:
    """"faster-whisper" for a CTranslate2 folder, "transformers" for a Whisper config."""
    if (folder / "model.bin").is_file():
        return "faster-whisper"
    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if isinstance(data, dict) and data.get("model_type") == "whisper":
            return "transformers"
    return None


def _cached(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached, or the cache is unreadable: both mean "not here"
        return None


def _missing(name: str) -> ModelError:
    return ModelError(
        f"The speech recognition model {name} is not on this machine.",
        f"Download it where there is internet with `hf download {name}` (or copy its folder "
        "here and give the folder's path), or use --asr pocketsphinx (offline, English, "
        "less accurate).")


def find_whisper() -> str | None:
    """The first known Whisper model in the local Hugging Face cache, or None."""
    for repo in KNOWN_WHISPER_MODELS:
        folder = _cached(repo)
        if folder is not None and model_kind(folder) is not None:
            if model_kind(folder) == "faster-whisper" and not _has("faster_whisper"):
                continue
            return repo
    return None


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


_CACHE: dict[tuple[str, str | None], Recognizer] = {}
_CACHE_LOCK = threading.Lock()


def describe(spec: str | None) -> str:
    """What `spec` resolves to, without loading anything heavy."""
    text = (spec or os.environ.get(ENV_VAR) or "auto").strip()
    if text.lower() == "auto":
        return find_whisper() or "pocketsphinx"
    return text


def load_recognizer(spec: str | None = None, device: str | None = None) -> Recognizer:
    """A recogniser for `spec` (see the module doc); cached per (spec, device)."""
    text = describe(spec)
    key = (text, device)
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    rec = _load(text, device)
    with _CACHE_LOCK:
        _CACHE.setdefault(key, rec)
        return _CACHE[key]


def _load(text: str, device: str | None) -> Recognizer:
    if text.lower() in ("pocketsphinx", "sphinx"):
        return PocketsphinxRecognizer()
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")):
        if not path.is_dir():
            raise ModelError(f"The speech recognition model {text} is not a folder.",
                             "Give the folder that holds the Whisper model (model.bin or "
                             "config.json).")
        folder, name = path, str(path)
    elif HUB_ID.match(text):
        found = _cached(text)
        if found is None:
            raise _missing(text)
        folder, name = found, text
    else:
        raise InputError(f"{text!r} is not a speech recognizer.",
                         f"Use pocketsphinx, auto, a hub id such as {SUGGESTED_MODEL}, "
                         "or a model folder.")
    kind = model_kind(folder)
    if kind == "faster-whisper":
        return FasterWhisperRecognizer(folder, name, device)
    if kind == "transformers":
        return TransformersWhisperRecognizer(folder, name, device)
    raise ModelError(f"{name} is not a Whisper model (no model.bin and no Whisper "
                     "config.json).", f"Give a Whisper model such as {SUGGESTED_MODEL}.")


# -- audio in -------------------------------------------------------------------------------------

def load_audio(path: str | os.PathLike[str]) -> np.ndarray:
    """Any supported audio file as 16 kHz mono float32; AudioError with the reason if not."""

    try:
        audio, _ = decode(path, SAMPLE_RATE)
    except BadAudioFile as exc:
        raise AudioError(f"{display_path(Path(path).name)} {exc.message}.",
                         "Give a WAV, FLAC, OGG or MP3 file that plays.") from exc
    return audio


def to_16k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    return resample(audio, sample_rate, SAMPLE_RATE)


def transcribe_file(path: str | os.PathLike[str], spec: str | None = None,
                    language: str | None = None, device: str | None = None) -> Transcript:
    """Recognise one audio file."""
    audio = load_audio(path)
    return load_recognizer(spec, device).transcribe(audio, language)
