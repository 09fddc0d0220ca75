"""Comparing two decoding computations robustly on every CPU.

Our decoding loop and the official `generate` (or our static and eager loops)
compute the same scores in a different order, so they agree to float32 (or
bf16) rounding, and the rounding depends on the processor's kernels (AVX2,
AVX-512, AMX). A greedy argmax or a sampled race can therefore flip where two
candidates are within rounding of each other, and free-running generation
then differs from there on. These helpers record every choice our loop makes
(`ChoiceLog`) so a test can say: the codes are equal, or they first differ at
a choice that was a near-tie in our own scores (and nowhere before).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from engine.synth.sampling import SamplerSettings, _filtered, choose, probabilities

#: codebook groups per codec frame; choice 16 f + g made code (f, g) of every row
GROUPS = 16


class ChoiceLog:
    """Wraps `choose` where the decoding loops call it: records every choice's
    scores, settings, noise and pick and, given another run's picks, returns
    those instead (teacher forcing)."""

    def __init__(self, forced: list[torch.Tensor] | None = None) -> None:
        self.forced = forced or []
        self.calls: list[tuple[torch.Tensor, SamplerSettings, torch.Tensor | None]] = []
        self.own: list[torch.Tensor] = []

    def __call__(self, scores: torch.Tensor, s: SamplerSettings,
                 noise: torch.Tensor | None) -> torch.Tensor:
        own = choose(scores, s, noise)
        self.calls.append((scores.clone(), s, None if noise is None else noise.clone()))
        self.own.append(own)
        i = len(self.own) - 1
        return self.forced[i] if i < len(self.forced) else own

    def compared(self, i: int) -> torch.Tensor:
        """What choice i is decided on: the distribution (sampling) or the scores."""
        scores, s, _ = self.calls[i]
        return probabilities(scores, s) if s.do_sample else scores

    def race(self, i: int, row: int, token: int) -> float:
        """The value choice i's argmax compares for `token` (p / noise when sampling)."""
        scores, s, noise = self.calls[i]
        if not s.do_sample:
            return float(scores[row, token])
        probs, index = _filtered(scores[row:row + 1], s)
        at = int((index[0] == token).nonzero()[0])
        assert noise is not None
        return float(probs[0, at] / noise[row, at])

    def near_tie(self, i: int, row: int, a: int, b: int, tie: float) -> bool:
        """Whether tokens a and b were within `tie` (relative) in choice i."""
        ra, rb = self.race(i, row, a), self.race(i, row, b)
        if self.calls[i][1].do_sample:
            top = max(abs(ra), abs(rb))
        else:  # logits: relative to their spread, not to one value near zero
            scores = self.calls[i][0][row]
            top = float(scores[torch.isfinite(scores)].abs().max())
        return abs(ra - rb) <= tie * max(top, 1e-30)


@contextmanager
def record_choices(monkeypatch: pytest.MonkeyPatch,
                   forced: list[torch.Tensor] | None = None) -> Iterator[ChoiceLog]:
    """Every `choose` call of the eager and static loops goes through a ChoiceLog."""
    import engine.synth.decoding as decoding
    import engine.synth.rows as rows

    log = ChoiceLog(forced)
    with monkeypatch.context() as m:
        m.setattr(decoding, "choose", log)
        m.setattr(rows, "choose", log)
        yield log


def assert_same_codes(ours: torch.Tensor, expected: torch.Tensor, log: ChoiceLog, eos: int,
                      row: int = 0, tie: float = 1e-4) -> None:
    """Greedy codes [frames, 16] equal, or equal up to a near-tie of our own scores.

    `tie` is relative to the largest score: 1e-4 is about a thousand times
    float32 rounding of these sums; bf16 runs need about 2e-2.
    """
    if ours.shape == expected.shape and torch.equal(ours, expected):
        return
    n = min(len(ours), len(expected))
    differ = (ours[:n].flatten() != expected[:n].flatten()).nonzero()
    # first differing choice; past the shorter run's end its token is end-of-speech
    k = int(differ[0]) if len(differ) else n * GROUPS
    f, g = divmod(k, GROUPS)
    mine = int(ours[f, g]) if f < len(ours) else eos
    theirs = int(expected[f, g]) if f < len(expected) else eos
    assert k < len(log.calls), f"codes differ at frame {f}, group {g}, after our last choice"
    assert log.near_tie(k, row, mine, theirs, tie), (
        f"codes differ at frame {f}, group {g} ({mine} against {theirs}) where our scores "
        f"were not a near-tie: {log.race(k, row, mine):.6g} against "
        f"{log.race(k, row, theirs):.6g}")
