"""The reinforce stage's loop learns (issue 33): on the tiny model, with a reward a policy
can raise (the share of frames whose codebook-0 code is below 1024), GRPO's mean reward
rises over 30 iterations while the KL to the reference stays bounded. Rollouts are
sampled by the engine's own decoder from the policy's weights, in place."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config.reinforce import ReinforceConfig
from engine.data.layout import LayoutIds
from engine.model.loading import load_model
from engine.reinforce.rollout import Render, Roller
from engine.reinforce.stage import frozen_copy, run_iterations
from engine.train.grpo import code_logprobs
from engine.train.objective import VoiceObjective, set_trainable

TEXTS = ["A short sentence to say.", "Another one, a little longer than that."]


def _low_share(renders: list[Render], texts: list[str]) -> list[float]:
    return [float((r.codes[:, 0] < 1024).mean()) if len(r.codes) else 0.0 for r in renders]


@pytest.fixture()
def setup(tiny_model_dir: Path) -> tuple[VoiceObjective, Roller]:
    torch.manual_seed(0)
    wrapper = load_model(tiny_model_dir, device="cpu", dtype=torch.float32)
    policy = VoiceObjective(wrapper.model.talker)
    set_trainable(policy, "talker")
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    hidden = int(cfg["talker_config"]["hidden_size"])
    speaker = torch.randn(hidden, generator=torch.Generator().manual_seed(1)) * 0.1
    roller = Roller(wrapper.model, wrapper.processor, wrapper.processor.tokenizer, speaker,
                    LayoutIds.from_config(cfg))
    return policy, roller


def test_rollouts_are_the_policys_and_their_layout_scores_every_code(
        setup: tuple[VoiceObjective, Roller]) -> None:
    policy, roller = setup
    renders = roller.sample(TEXTS, group=3, max_frames=12, seed=0)
    again = roller.sample(TEXTS, group=3, max_frames=12, seed=0)
    assert [r.prompt for r in renders] == [0, 0, 0, 1, 1, 1]
    assert all(np.array_equal(a.codes, b.codes) for a, b in zip(renders, again, strict=True))
    assert len({r.codes.tobytes() for r in renders}) > 1  # sampled, not one greedy path
    batch = roller.batch(TEXTS, renders, "cpu")
    with torch.no_grad():
        lp = code_logprobs(policy, batch)
    for i, r in enumerate(renders):
        # each frame's 16 codes, and the end of speech after them where it was sampled
        assert int((lp.render == i).sum()) == 16 * len(r.codes) + (0 if r.capped else 1)
        assert r.capped == (len(r.codes) == 12)


def test_a_render_cut_at_the_cap_scores_no_end_of_speech(
        setup: tuple[VoiceObjective, Roller]) -> None:
    # two frames: the tiny model never ends that soon, so every render is cut at the cap
    policy, roller = setup
    renders = roller.sample(TEXTS[:1], group=2, max_frames=2, seed=0)
    assert all(r.capped and len(r.codes) == 2 for r in renders)
    with torch.no_grad():
        lp = code_logprobs(policy, roller.batch(TEXTS[:1], renders, "cpu"))
    # the policy never sampled an end of speech there: pushing it down would teach the
    # penalised capped render to run on
    assert [int((lp.render == i).sum()) for i in range(2)] == [32, 32]
    waves = roller.audio(renders)
    assert [len(w) for w in waves] == [2 * 1920, 2 * 1920]


@pytest.mark.slow
def test_grpo_raises_a_reward_the_policy_can_raise_with_the_kl_bounded(
        setup: tuple[VoiceObjective, Roller]) -> None:
    policy, roller = setup
    reference = frozen_copy(policy)
    settings = ReinforceConfig(group=6, iterations=30, updates=2, lr=1e-2, beta=0.2, max_frames=12)
    history = run_iterations(policy, reference, roller, TEXTS, _low_share, settings)
    rewards = [h["reward"] for h in history]
    kls = [h["kl"] for h in history]
    first, last = float(np.mean(rewards[:5])), float(np.mean(rewards[-5:]))
    print("reward by iteration:", [round(r, 3) for r in rewards])
    print("kl by iteration:", [round(k, 4) for k in kls])
    assert last > first + 0.1, (first, last)
    assert max(kls) < 1.0 and all(k >= 0 for k in kls)
