"""Codec extraction: prepared clips -> (T, 16) code arrays, plus the speaker x-vector.

Input: `<voice>/prepared/manifest.jsonl` (read through engine.layout.manifest; usable
clips only) and a base model folder (its `speech_tokenizer/` is the 12 Hz
codec, its `speaker_encoder.*` tensors the x-vector network).

Output, under `<voice>/prepared/codes/`:
- `<sha>.npy`: int16 (T, 16) codes of one clip, where sha = sha256(clip file
  bytes + codec fingerprint). Re-running finds them and does no work; a clip
  whose audio changed, or another codec, gets a new file.
- `xvec-<sha>.npy`: float32 x-vector of the reference clip for one speaker
  encoder (sha over the clip bytes and the encoder weights).
- `index.json`: what the dataset reads: the codec fingerprint, every clip's
  codes file and frame count, the reference clip and its x-vector file.

Each clip is encoded alone (batch of one), so its codes depend on its audio
only, never on what else shared a batch; that is what makes the cache valid.
Two ways to run: `extract_codes` (in this process) and `extract_codes_ray`
(Ray tasks: one per GPU when the cluster has GPUs, else a few CPU tasks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.audio.timebase import SAMPLE_RATE
from engine.core.atomic import atomic_path, write_json
from engine.core.errors import AudioError, Cancelled, TrainingError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.manifest import CODES_INDEX, choose_reference, prepared_folder, read_manifest
from engine.layout.voice import file_sha256
from engine.model.files import memo_per_version
from engine.model.official import import_qwen_tts
from engine.model.speaker_encoder import (
    load_speaker_encoder,
    speaker_encoder_fingerprint,
    x_vector,
)

#: bump when the way codes are computed changes, so old caches are not reused
CODES_VERSION = 1

# -- hashing ------------------------------------------------------------

def codec_fingerprint(model_dir: str | Path) -> str:
    """sha256 over the codec's config and weights (memoised per file version)."""
    codec = Path(model_dir) / "speech_tokenizer"
    weights = sorted(codec.glob("*.safetensors"))
    if not (codec / "config.json").is_file() or not weights:
        raise TrainingError(f"{model_dir} has no 12 Hz codec (speech_tokenizer/).",
                            "Use a complete Qwen3-TTS-12Hz model folder.")

    def compute() -> str:
        h = hashlib.sha256(f"codes-v{CODES_VERSION}".encode())
        h.update((codec / "config.json").read_bytes())
        for w in weights:
            h.update(file_sha256(w).encode())
        return h.hexdigest()

    return memo_per_version(weights[0], compute, "codec")


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def read_clip(voice_dir: Path, entry: dict[str, Any]) -> np.ndarray:
    """The clip as float32 mono at 24 kHz (the codec and speaker encoder need exactly that)."""
    path = voice_dir / entry["path"]
    try:
        audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (OSError, RuntimeError) as exc:
        raise AudioError(f"Cannot read prepared clip {entry['id']} ({path}).",
                         "Prepare the voice again.") from exc
    if sr != SAMPLE_RATE:
        raise AudioError(f"Prepared clip {entry['id']} is {sr} Hz, not 24 kHz.",
                         "Prepare the voice again; codes need 24 kHz input.")
    return np.ascontiguousarray(audio.mean(axis=1))


# -- the index -------------------------------------------------------------------------

@dataclass
class CodesIndex:
    """What extraction produced for one voice and one base model."""

    voice_dir: Path
    codec: str
    speaker_encoder: str
    #: clip id -> {"file", "frames", "text", "duration_s", "sha", "style"}
    clips: dict[str, dict[str, Any]] = field(default_factory=dict)
    reference_clip: str | None = None
    x_vector_file: str | None = None

    @property
    def codes_dir(self) -> Path:
        return prepared_folder(self.voice_dir).codes_dir

    def codes(self, clip_id: str) -> np.ndarray:
        """(T, 16) int64 codes of a clip."""
        return np.load(self.codes_dir / self.clips[clip_id]["file"]).astype(np.int64)

    def x_vector(self) -> np.ndarray:
        if self.x_vector_file is None:
            raise TrainingError("No speaker x-vector was extracted for this voice.")
        return np.load(self.codes_dir / self.x_vector_file).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {"version": CODES_VERSION, "codec": self.codec,
                "speaker_encoder": self.speaker_encoder, "reference_clip": self.reference_clip,
                "x_vector_file": self.x_vector_file, "clips": self.clips}


def load_codes_index(voice_dir: str | Path) -> CodesIndex:
    voice_dir = Path(voice_dir)
    path = prepared_folder(voice_dir).codes_index
    if not path.is_file():
        raise TrainingError(f"{voice_dir.name} has no codec codes yet.",
                            "Run code extraction (train does it first).")
    d = json.loads(path.read_text(encoding="utf-8"))
    return CodesIndex(voice_dir, d["codec"], d["speaker_encoder"], d["clips"],
                      d.get("reference_clip"), d.get("x_vector_file"))


# -- encoding ------------------------------------------------------------------------------

def load_codec(model_dir: str | Path, device: str = "cpu") -> Any:
    """The official 12 Hz tokenizer wrapper (fp32) on `device`."""
    import torch  # noqa: PLC0415

    qt = import_qwen_tts()
    return qt.Qwen3TTSTokenizer.from_pretrained(str(Path(model_dir) / "speech_tokenizer"),
                                               dtype=torch.float32, device_map=device)


def encode_clip(codec: Any, audio: np.ndarray) -> np.ndarray:
    """(T, 16) int16 codes of one 24 kHz clip."""
    out = codec.encode(audio, sr=SAMPLE_RATE)
    codes = out.audio_codes[0].detach().cpu().numpy()
    if codes.ndim != 2 or codes.shape[1] != 16:
        raise TrainingError(f"The codec returned codes of shape {codes.shape}, not (T, 16).")
    return codes.astype(np.int16)


def _encode_many(model_dir: str, device: str, items: list[tuple[str, np.ndarray]],
                 threads: int = 1) -> list[tuple[str, np.ndarray]]:
    """Runs in a Ray task or in-process: load the codec once, encode each clip alone."""
    import torch  # noqa: PLC0415

    if device == "cpu":
        torch.set_num_threads(threads)
    codec = load_codec(model_dir, device)
    return [(key, encode_clip(codec, audio)) for key, audio in items]


@dataclass
class _Plan:
    voice_dir: Path
    clips: list[dict[str, Any]]
    codec: str
    speaker_encoder: str
    #: clip id -> (cache file name, clip sha)
    files: dict[str, tuple[str, str]]
    missing: list[str]


def _plan(voice_dir: Path, model_dir: Path) -> _Plan:
    clips = read_manifest(voice_dir)
    if not clips:
        raise TrainingError(f"{voice_dir.name} has no usable prepared clips.",
                            "Check the prepare report and record or import more audio.")
    codec = codec_fingerprint(model_dir)
    spk = speaker_encoder_fingerprint(model_dir)
    out_dir = prepared_folder(voice_dir).codes_dir
    files: dict[str, tuple[str, str]] = {}
    missing = []
    for c in clips:
        sha = file_sha256(voice_dir / c["path"])
        name = _key(sha, codec) + ".npy"
        files[c["id"]] = (name, sha)
        if not (out_dir / name).is_file():
            missing.append(c["id"])
    return _Plan(voice_dir, clips, codec, spk, files, missing)


def _save_codes(out_dir: Path, name: str, codes: np.ndarray) -> None:
    with atomic_path(out_dir / name, suffix=".npy") as tmp, open(tmp, "wb") as fh:
        np.save(fh, codes)


def _finish(plan: _Plan, model_dir: Path, reference_clip: str | None, em: Emitter) -> CodesIndex:
    out_dir = prepared_folder(plan.voice_dir).codes_dir
    by_id = {c["id"]: c for c in plan.clips}
    index = CodesIndex(plan.voice_dir, plan.codec, plan.speaker_encoder)
    for cid, (name, sha) in plan.files.items():
        frames = int(np.load(out_dir / name, mmap_mode="r").shape[0])
        c = by_id[cid]
        index.clips[cid] = {"file": name, "frames": frames, "text": c["text"],
                            "duration_s": float(c.get("duration_s", 0.0)), "sha": sha,
                            # rewritten at every start: an edited description travels to
                            # every worker with the codes (workers have no manifest)
                            "style": str(c.get("style") or "").strip()}
    ref = choose_reference(plan.voice_dir, plan.clips, reference_clip)
    xname = "xvec-" + _key(plan.files[ref][1], plan.speaker_encoder) + ".npy"
    if not (out_dir / xname).is_file():
        em.state("x_vector", detail=ref)
        vec = x_vector(load_speaker_encoder(model_dir), read_clip(plan.voice_dir, by_id[ref]))
        _save_codes(out_dir, xname, vec.astype(np.float32))
    index.reference_clip, index.x_vector_file = ref, xname
    write_json(out_dir / CODES_INDEX, index.to_dict())
    _remove_stale(out_dir, {n for n, _ in plan.files.values()} | {xname})
    em.artifact(str(out_dir / CODES_INDEX), "codes_index")
    return index


def _remove_stale(out_dir: Path, keep: set[str]) -> None:
    """Drop code files no current clip uses (a re-prepared voice leaves old ones)."""
    for f in out_dir.glob("*.npy"):
        if f.name not in keep and not f.name.startswith("xvec-"):
            f.unlink(missing_ok=True)


def _start(voice_dir: Path, model_dir: Path,
           em: Emitter) -> tuple[Any, Path, dict[str, dict[str, Any]], int]:
    """What both extraction paths begin with: the plan, where codes go, the first progress."""
    plan = _plan(voice_dir, model_dir)
    by_id = {c["id"]: c for c in plan.clips}
    total = len(plan.missing)
    em.progress("codes", 0, total, cached=len(plan.clips) - total)
    return plan, prepared_folder(voice_dir).codes_dir, by_id, total


def extract_codes(voice_dir: str | Path, model_dir: str | Path, *, device: str = "cpu",
                  reference_clip: str | None = None,
                  on_event: EventCallback | Emitter | None = None,
                  should_stop: Callable[[], bool] | None = None) -> CodesIndex:
    """Encode every usable clip not yet cached, in this process; returns the index."""
    em = as_emitter(on_event)
    voice_dir, model_dir = Path(voice_dir), Path(model_dir)
    plan, out_dir, by_id, total = _start(voice_dir, model_dir, em)
    if plan.missing:
        codec = load_codec(model_dir, device)
        for n, cid in enumerate(plan.missing, 1):
            if should_stop is not None and should_stop():
                raise Cancelled("Code extraction cancelled; finished clips are kept.")
            _save_codes(out_dir, plan.files[cid][0],
                        encode_clip(codec, read_clip(voice_dir, by_id[cid])))
            em.progress("codes", n, total)
    return _finish(plan, model_dir, reference_clip, em)


def extract_codes_ray(voice_dir: str | Path, model_dir: str | Path, *,
                      reference_clip: str | None = None, num_tasks: int | None = None,
                      on_event: EventCallback | Emitter | None = None) -> CodesIndex:
    """Like `extract_codes`, with the encoding spread over Ray tasks.

    Needs a connected Ray cluster (`engine.cluster.connect`). One task per
    GPU when the cluster has GPUs (each loads the codec once), else
    `num_tasks` CPU tasks (default: half the cluster's CPUs, at most 4).
    Audio travels to the tasks through the object store and codes come back
    to this process, which writes the cache: tasks need only the model folder.
    """
    import ray  # noqa: PLC0415

    if not ray.is_initialized():
        raise TrainingError("Code extraction with Ray needs a running cluster.")
    em = as_emitter(on_event)
    voice_dir, model_dir = Path(voice_dir), Path(model_dir)
    plan, out_dir, by_id, total = _start(voice_dir, model_dir, em)
    if plan.missing:
        res = ray.cluster_resources()
        gpus = int(res.get("GPU", 0))
        if gpus > 0:
            n_tasks, opts, device = gpus, {"num_gpus": 1, "num_cpus": 1}, "cuda"
        else:
            cpus = int(res.get("CPU", 1))
            n_tasks = num_tasks or max(1, min(4, cpus // 2))
            opts, device = {"num_cpus": 1}, "cpu"
        n_tasks = max(1, min(n_tasks, total))
        # Longest clips first, dealt round-robin: tasks finish at about the same time.
        order = sorted(plan.missing, key=lambda c: -float(by_id[c].get("duration_s", 0.0)))
        chunks = [order[i::n_tasks] for i in range(n_tasks)]
        remote = ray.remote(**opts)(_encode_many)
        refs = []
        for chunk in chunks:
            items = [(cid, read_clip(voice_dir, by_id[cid])) for cid in chunk]
            refs.append(remote.remote(str(model_dir), device, items))
        done = 0
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for cid, codes in ray.get(ready[0]):
                    _save_codes(out_dir, plan.files[cid][0], codes)
                    done += 1
                em.progress("codes", done, total)
        except ray.exceptions.RayError as exc:
            for ref in pending:
                ray.cancel(ref, force=True)
            # finished clips are already saved: a re-run only does the rest
            raise TrainingError(f"Code extraction failed on the cluster: {exc}".splitlines()[0],
                                "Run again (finished clips are kept); check the Ray logs "
                                "if it keeps failing.") from exc
    return _finish(plan, model_dir, reference_clip, em)

