"""Which frames the code predictor is trained on when it sees only a sample of them.

Codebook 0 is scored on every frame; with `predictor_frames` F < 1 the code
predictor (sub-talker) runs only on K = ceil(F x N) of the N real frames of an
optimizer step (all ranks, all micro-batches), and its summed loss is divided
by K. Every frame of the step is in the sample with probability exactly K / N,
so the sampled loss's expectation is the full loss:

- the step's K is split over its (micro-batch, rank) blocks by one
  multivariate hypergeometric draw seeded from (run seed, step): every rank
  computes the same split without any communication;
- each rank then picks its share of frames inside each of its micro-batches
  with a draw seeded from (run seed, step, rank, micro-batch), so two ranks
  never mirror each other's choice and a resumed run draws the same frames.

The picks index the micro-batch's frame rows in the order the loss builds them
(`engine.train.loss.host_rows` of the frame mask: row-major, clip by clip), on
the host, so the device never has to report a size. Plain numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: stream tags, so the split and the picks never share a random stream with the epoch order
_SPLIT_TAG, _PICK_TAG = 0x5F11, 0x5F12


@dataclass(frozen=True)
class PredictorSample:
    """The sampling of a run: the fraction F (0 < F <= 1) and the run's seed."""

    fraction: float
    seed: int

    @property
    def active(self) -> bool:
        return self.fraction < 1.0


def sampled_total(frames: int, fraction: float) -> int:
    """K: how many of a step's `frames` the code predictor sees (at least one)."""
    if frames <= 0:
        return 0
    return max(1, min(frames, math.ceil(fraction * frames - 1e-9)))


def step_split(block_frames: np.ndarray, sample: PredictorSample, step: int) -> np.ndarray:
    """Sampled frames per block: `block_frames` (micro-batches, ranks) of one optimizer step;
    the same answer on every rank (seeded by the run seed and the step only)."""
    counts = np.asarray(block_frames, dtype=np.int64)
    total = sampled_total(int(counts.sum()), sample.fraction)
    rng = np.random.default_rng([sample.seed, step, _SPLIT_TAG])
    return rng.multivariate_hypergeometric(counts.reshape(-1), total).reshape(counts.shape)


def pick_frames(frames: int, count: int, sample: PredictorSample, step: int, rank: int,
                micro: int) -> np.ndarray:
    """`count` of a micro-batch's `frames` frame rows, sorted (positions in its frame rows)."""
    rng = np.random.default_rng([sample.seed, step, rank, micro, _PICK_TAG])
    return np.sort(rng.choice(frames, size=count, replace=False)).astype(np.int64)


def rank_picks(block_frames: np.ndarray, sample: PredictorSample, step: int,
               rank: int) -> tuple[list[np.ndarray], int]:
    """(this rank's picks per micro-batch, K of the whole step) for one optimizer step.

    A micro-batch's picks may be empty (its share of the sample drew zero):
    `engine.train.objective` then runs the predictor on one frame whose loss counts zero
    times, since under FSDP every rank must run every unit's forward and backward.
    """
    split = step_split(block_frames, sample, step)
    counts = np.asarray(block_frames, dtype=np.int64)
    picks = [pick_frames(int(counts[m, rank]), int(split[m, rank]), sample, step, rank, m)
             for m in range(counts.shape[0])]
    return picks, int(split.sum())
