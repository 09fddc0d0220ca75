"""The reinforce stage on Ray (issue 33): the policy update in two Ray Train / FSDP2 CPU
workers on the session's shared cluster, rollouts and scoring (recogniser and encoder
loaded once) in one Ray actor, the weights sent to it every iteration; checkpoints of
training's format, figures in the run's metrics; the sharded update equals the one-process
update on the same iteration."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from engine import api
from engine.config.reinforce import ReinforceConfig
from engine.core.events import Event
from engine.layout.checkpoints import REINFORCE_STAGE, step_of
from engine.layout.run import Run
from engine.model.checkpoint_weights import checkpoint_tensors
from engine.reinforce.reward import TERMS
from tests.helpers.voices import copy_voice


def test_the_stage_on_two_ray_workers_updates_the_sharded_policy(
        trained_run: dict[str, Any], ray_cluster: Any, tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], tmp_path / "joe")
    run = Run(voice / "runs" / trained_run["run"].name)
    base = max(step_of(c) for c in run.checkpoints())
    cfg = ReinforceConfig(iterations=2, prompts=1, group=2, max_frames=12, checkpoint_every=1,
                          lr=1e-3)
    events: list[Event] = []
    out = api.reinforce(voice, run.name, on_event=events.append, config=cfg,
                        asr="pocketsphinx", workers=2)
    assert not out["stopped"] and out["iterations"] == 2 and out["step"] == base + 2
    # the rank-0 figures reached the run's metrics and the event stream
    rows = [r for r in run.metrics() if r.get("kind") == "reinforce"]
    assert [r["iteration"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("reward", *TERMS, "kl", "reward_spread", "clipped"):
            assert math.isfinite(r[f"reinforce/{key}"]), key
    assert [e.data["values"]["iteration"] for e in events
            if e.kind == "metric" and e.data.get("split") == "reinforce"] == [1, 2]
    saved = run.checkpoint(base + 2)
    state = json.loads((saved / "trainer.json").read_text(encoding="utf-8"))
    assert state["stage"] == REINFORCE_STAGE and state["world_size"] == 2
    assert state["iteration"] == 2 and state["from_step"] == base
    # the sharded update moved the weights, saved whole in training's format
    start, after = checkpoint_tensors(run.checkpoint(base)), checkpoint_tensors(saved)
    assert set(start) == set(after)
    assert any(not np.array_equal(start[k].numpy(), after[k].numpy()) for k in start)

    # the sharded update is the one-process update: the same renders and rewards (seeded
    # by the iteration), the same step of the weights within float rounding
    alone = copy_voice(trained_run["voice"], tmp_path / "alone")
    one = api.reinforce(alone, run.name, config=replace(cfg, iterations=1), asr="pocketsphinx")
    assert one["history"][0]["reinforce/reward"] == rows[0]["reinforce/reward"]
    assert abs(one["history"][0]["reinforce/kl"] - rows[0]["reinforce/kl"]) < 1e-6
    ours = checkpoint_tensors(Run(alone / "runs" / run.name).checkpoint(base + 1))
    sharded = checkpoint_tensors(run.checkpoint(base + 1))
    gap = max(float((ours[k] - sharded[k]).abs().max()) for k in ours)
    moved = float(np.mean([float((ours[k] - start[k]).abs().mean()) for k in ours]))
    assert gap < 1e-5 < 1e-4 < moved, (gap, moved)
