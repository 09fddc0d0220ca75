"""Rewards for the reinforce stage's tests, named by import spec in `[reinforce] reward`
("tests.helpers.rewards:low_codes"), so the Ray rollout actor imports them as the
one-process stage does (a local cluster's workers import from the driver's folder)."""

from __future__ import annotations

from typing import Any

from engine.reinforce.reward import RewardContext
from engine.reinforce.rollout import Render

#: codebook-0 codes below this are "low" (the tiny model's codebook has 2048 codes)
LOW = 1024


def low_share(render: Render) -> float:
    """The share of a render's frames whose codebook-0 code is below `LOW`."""
    return float((render.codes[:, 0] < LOW).mean()) if len(render.codes) else 0.0


def low_codes(ctx: RewardContext) -> Any:
    """A reward a policy can raise: the share of low codebook-0 codes (no audio decoded,
    no recogniser loaded)."""
    return lambda renders, texts: [low_share(r) for r in renders]

