"""Training data of one voice: clips laid out, split, bucketed, batched per rank.

Order of a run is a pure function of (seed, epoch): every rank computes the
same global plan and takes its own share, so no communication is needed and
a resumed run (epoch, position) replays exactly the same batches.

- Split: `val_fraction` of the clips (at least `val_min`) are held out, chosen
  by the seed, never trained on.
- Epoch plan: shuffle, then sort by length inside windows of `bucket_batches`
  batches and cut into batches, then shuffle the batches. Each batch holds
  clips of similar length (little padding) while the order of batches stays
  random. Clips that do not fill a whole optimizer step are left out of this
  epoch (a different few each epoch).
- Rank share: the clips of a global batch are dealt to ranks longest first,
  each to the rank with the fewest tokens so far (every rank gets at least one).
- Loss normalisers: each micro-batch carries the token counts of its whole
  optimizer step (all ranks, all micro-batches) divided by world x grad_accum
  (see engine.train.loss.normalisers): with the loop's usual
  `(loss / grad_accum).backward()` and FSDP's averaging over ranks, the
  gradient is exactly that of one big batch.

Light module: numpy only at import time (the tokenizer loads lazily).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.timebase import FRAME_RATE
from engine.config.data import DataConfig
from engine.core.errors import TrainingError
from engine.data.codes import CodesIndex, load_codes_index
from engine.data.frames import PredictorSample, rank_picks
from engine.data.layout import (
    NUM_CODEBOOKS,
    ClipSequence,
    LayoutIds,
    build_sequence,
    collate,
    sequence_length,
    tokenize,
    tokenize_instruct,
)
from engine.model.loading import read_model_config
from engine.model.official import import_qwen_tts
from engine.text import training_text


@dataclass(frozen=True)
class Clip:
    """One usable clip: its text tokens and its frame count (codes load lazily)."""

    id: str
    role_ids: tuple[int, ...]
    text_ids: tuple[int, ...]
    frames: int
    #: the style description's instruction tokens this clip trains with (empty: none)
    instruct_ids: tuple[int, ...] = ()

    @property
    def length(self) -> int:
        return sequence_length(len(self.text_ids), self.frames, len(self.instruct_ids))

    @property
    def talker_tokens(self) -> int:
        return self.frames + 1  # every frame and the final eos

    @property
    def subtalker_tokens(self) -> int:
        return self.frames * (NUM_CODEBOOKS - 1)


def load_text_tokenizer(model_dir: str | Path) -> Any:
    """The model's text tokenizer, loaded the way official inference loads it."""
    import_qwen_tts()
    proc = importlib.import_module("qwen_tts.core.models.processing_qwen3_tts")
    return proc.Qwen3TTSProcessor.from_pretrained(str(model_dir), fix_mistral_regex=True).tokenizer


def trains_plain(clip_id: str, seed: int, plain_share: float) -> bool:
    """Whether a described clip trains without its description: a fixed draw per
    (seed, clip), so every rank and a resumed run lay it out the same way."""
    digest = hashlib.sha256(f"{seed}\n{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < plain_share


def split_ids(ids: Sequence[str], val_fraction: float, val_min: int, seed: int
              ) -> tuple[list[str], list[str]]:
    """(train, validation) clip ids, chosen by the seed.

    Validation gets max(val_min, val_fraction x clips) when val_fraction > 0,
    never more than a fifth of the clips (training data matters more).
    """
    ordered = sorted(ids)
    n = len(ordered)
    n_val = max(val_min, round(val_fraction * n)) if val_fraction > 0 else 0
    n_val = min(n_val, n // 5)
    perm = np.random.default_rng([seed, 0x5A11]).permutation(n)
    val = sorted(ordered[i] for i in perm[:n_val])
    val_set = set(val)
    return [i for i in ordered if i not in val_set], val


def epoch_batches(lengths: Sequence[int], batch_size: int, accum: int, bucket_batches: int,
                  seed: int, epoch: int) -> list[list[int]]:
    """Global micro-batches (lists of clip indices) of one epoch, in training order."""
    n = len(lengths)
    per_step = batch_size * accum
    steps = n // per_step
    if steps == 0:
        return []
    rng = np.random.default_rng([seed, epoch, 0xB0C])
    perm = rng.permutation(n)[: steps * per_step]
    window = batch_size * bucket_batches
    batches: list[list[int]] = []
    for start in range(0, len(perm), window):
        chunk = sorted(perm[start:start + window].tolist(), key=lambda i: (lengths[i], i))
        batches.extend(chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def rank_share(lengths: Sequence[int], batch: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's clips of a global batch: longest first to the least-loaded rank."""
    if len(batch) < world:
        raise ValueError(f"a batch of {len(batch)} clips cannot feed {world} ranks")
    loads = [0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(batch, key=lambda i: (-lengths[i], i)):
        # empty ranks first, so every rank gets a clip
        r = min(range(world), key=lambda r: (len(shares[r]) > 0, loads[r], r))
        shares[r].append(i)
        loads[r] += lengths[i]
    return sorted(shares[rank], key=lambda i: (lengths[i], i))


class _LazyBatches(Sequence[dict[str, Any]]):
    """A list of micro-batches that are collated only when indexed."""

    def __init__(self, data: VoiceData, plan: list[list[int]], rank: int, world: int,
                 accum: int, items: list[Clip], predictor: PredictorSample | None = None,
                 first_step: int = 0) -> None:
        self._data, self._plan, self._rank, self._world = data, plan, rank, world
        self._accum, self._items = accum, items
        self._predictor = predictor if predictor is not None and predictor.active else None
        #: the run's optimizer step of this epoch's first step (seeds the frame sample)
        self._first_step = first_step

    def __len__(self) -> int:
        return len(self._plan)

    def __getitem__(self, k: int) -> dict[str, Any]:  # type: ignore[override]
        if not -len(self) <= k < len(self):
            raise IndexError(k)
        k %= len(self)
        step = k // self._accum
        group = self._plan[step * self._accum:(step + 1) * self._accum]
        t = sum(self._items[i].talker_tokens for b in group for i in b)
        s = sum(self._items[i].subtalker_tokens for b in group for i in b)
        lengths = [c.length for c in self._items]
        share = rank_share(lengths, self._plan[k], self._rank, self._world)
        batch = self._data.collate([self._items[i] for i in share])
        denom = self._world * self._accum
        batch["talker_norm"] = t / denom
        batch["subtalker_norm"] = s / denom
        if self._predictor is not None:
            # every rank's frames in every micro-batch of the step: the shared split
            blocks = np.array([[sum(self._items[i].frames
                                    for i in rank_share(lengths, b, r, self._world))
                                for r in range(self._world)] for b in group])
            picks, sampled = rank_picks(blocks, self._predictor, self._first_step + step,
                                        self._rank)
            batch["predictor_pick"] = picks[k - step * self._accum]
            batch["subtalker_norm"] = sampled * (NUM_CODEBOOKS - 1) / denom
        return batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for k in range(len(self)):
            yield self[k]


class VoiceData:
    """The laid-out clips of one voice for one base model, with train/val split."""

    def __init__(self, index: CodesIndex, ids: LayoutIds, clips: list[Clip],
                 cfg: DataConfig | None = None, skipped: list[str] | None = None) -> None:
        cfg = cfg or DataConfig()
        self.index = index
        self.ids = ids
        self.batch_size, self.grad_accum = cfg.batch_size, cfg.grad_accum
        self.bucket_batches, self.seed = cfg.bucket_batches, cfg.seed
        self.skipped = skipped or []
        by_id = {c.id: c for c in clips}
        train_ids, val_ids = split_ids(list(by_id), cfg.val_fraction, cfg.val_min, cfg.seed)
        self.train = [by_id[i] for i in train_ids]
        self.val = [by_id[i] for i in val_ids]
        self.x_vector = index.x_vector()
        self._codes: dict[str, np.ndarray] = {}

    @classmethod
    def open(cls, voice_dir: str | Path, model_dir: str | Path, cfg: DataConfig | None = None,
             tokenizer: Any = None) -> VoiceData:
        """From extracted codes (`engine.data.codes`) and the model's tokenizer."""
        cfg = cfg or DataConfig()
        index = load_codes_index(voice_dir)
        config = read_model_config(model_dir)
        ids = LayoutIds.from_config(config)
        tok = tokenizer or load_text_tokenizer(model_dir)
        clips, skipped = [], []
        for cid, entry in index.clips.items():
            role, text = tokenize(tok, training_text(entry["text"]))
            # the manifest's description, copied into the index at every start
            style = str(entry.get("style") or "").strip()
            if style and trains_plain(cid, cfg.seed, cfg.plain_share):
                style = ""
            clip = Clip(cid, tuple(role), tuple(text), int(entry["frames"]),
                        tuple(tokenize_instruct(tok, style)))
            if clip.length > cfg.max_seq_len:
                skipped.append(cid)  # too long for the configured sequence budget
                continue
            clips.append(clip)
        if not clips:
            raise TrainingError("No clip fits in the maximum sequence length.",
                                "Raise data.max_seq_len or prepare shorter clips.")
        return cls(index, ids, clips, cfg, skipped)

    # -- sizes -----------------------------------------------------------------------

    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (the same on every rank)."""
        return len(self.train) // (self.batch_size * self.grad_accum)

    def micro_batches_per_epoch(self) -> int:
        return self.steps_per_epoch() * self.grad_accum

    def check(self, world: int) -> None:
        """Fail fast, with one clear sentence, when the data cannot feed this run."""
        if self.batch_size < world:
            raise TrainingError(f"A batch of {self.batch_size} clips cannot feed {world} workers.",
                                f"Use a batch size of at least {world}.")
        if self.steps_per_epoch() == 0:
            need = self.batch_size * self.grad_accum
            raise TrainingError(
                f"Only {len(self.train)} training clips, fewer than one optimizer step "
                f"needs ({need}).", "Prepare more audio or lower the batch size.")

    # -- batches -----------------------------------------------------------------------

    def epoch_plan(self, epoch: int) -> list[list[int]]:
        lengths = [c.length for c in self.train]
        return epoch_batches(lengths, self.batch_size, self.grad_accum, self.bucket_batches,
                             self.seed, epoch)

    def rank_batches(self, epoch: int, rank: int = 0, world: int = 1,
                     predictor: PredictorSample | None = None) -> Sequence[dict[str, Any]]:
        """This rank's micro-batches of `epoch`, in order; index k resumes at micro-batch k.

        predictor: the code predictor sees only a sample of each step's frames
        (`engine.data.frames`): each micro-batch then carries its picks
        ("predictor_pick") and the sampled count of its step as "subtalker_norm".
        """
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world {world}")
        return _LazyBatches(self, self.epoch_plan(epoch), rank, world, self.grad_accum,
                            self.train, predictor, epoch * self.steps_per_epoch())

    def val_batches(self, rank: int = 0, world: int = 1) -> list[dict[str, Any]]:
        """This rank's validation micro-batches (fixed order; empty when too few clips)."""
        if len(self.val) < world:
            return []
        n_batches = max(1, -(-len(self.val) // self.batch_size))
        n_batches = min(n_batches, len(self.val) // world)
        ordered = sorted(range(len(self.val)), key=lambda i: (self.val[i].length, i))
        groups = [ordered[k::n_batches] for k in range(n_batches)]
        lengths = [c.length for c in self.val]
        return [self.collate([self.val[i] for i in rank_share(lengths, g, rank, world)])
                for g in groups]

    def sequence(self, clip: Clip) -> ClipSequence:
        return build_sequence(self.ids, clip.role_ids, clip.text_ids, self.codes(clip.id),
                              clip.instruct_ids)

    def codes(self, clip_id: str) -> np.ndarray:
        if clip_id not in self._codes:
            self._codes[clip_id] = self.index.codes(clip_id)
        return self._codes[clip_id]

    def collate(self, clips: Sequence[Clip]) -> dict[str, Any]:
        batch: dict[str, Any] = collate([self.sequence(c) for c in clips], self.ids)
        batch["x_vector"] = np.repeat(self.x_vector[None], len(clips), axis=0)
        batch["clip_ids"] = [c.id for c in clips]
        return batch

    # -- reporting -----------------------------------------------------------------------

    def padding_efficiency(self, epoch: int = 0, world: int = 1) -> float:
        """Real positions / computed positions over one epoch (1.0 = no padding)."""
        lengths = [c.length for c in self.train]
        real = computed = 0
        for b in self.epoch_plan(epoch):
            for r in range(world):
                share = rank_share(lengths, b, r, world)
                real += sum(lengths[i] for i in share)
                computed += len(share) * max(lengths[i] for i in share)
        return real / computed if computed else 1.0

    def summary(self) -> dict[str, Any]:
        frames = sum(c.frames for c in self.train)
        return {
            "train_clips": len(self.train), "val_clips": len(self.val),
            "skipped_clips": len(self.skipped), "train_frames": frames,
            "train_minutes": round(frames / FRAME_RATE / 60.0, 3),
            "max_seq_len": max((c.length for c in self.train), default=0),
            "mean_seq_len": round(float(np.mean([c.length for c in self.train])), 1)
            if self.train else 0.0,
            "steps_per_epoch": self.steps_per_epoch(),
            "styled_clips": sum(1 for c in self.train if c.instruct_ids),
            "reference_clip": self.index.reference_clip,
        }
