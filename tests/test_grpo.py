"""GRPO's pieces (issue 33) against slow, obvious references on the tiny model: the
log-probabilities of sampled codes, the group advantage, the clipped ratio and the KL
term, and the policy gradient they give."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.train.grpo import CodeLogprobs, code_logprobs, group_advantages, grpo_loss
from engine.train.objective import batch_to_device, build_objective, load_base_weights
from tests.helpers.batches import layout_batch, layout_sequences


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Any:
    torch.manual_seed(0)
    objective = build_objective(tiny_model_dir, device="meta")
    load_base_weights(objective, tiny_model_dir, "cpu")
    return objective.float()


def test_code_logprobs_are_minus_the_objectives_cross_entropy_render_by_render(
        policy: Any, tiny_model_dir: Path) -> None:
    """Each render's summed log-probability equals minus the supervised loss's two
    cross-entropy sums over that render alone (the same targets, scored one clip at
    a time), and every code of it is counted once: each frame's codebook 0 and the end of
    speech (the talker's targets), and each frame's codebooks 1..15."""
    seqs, ids, xv = layout_sequences(tiny_model_dir)
    which = [0, 1, 3]
    batch = layout_batch(seqs, ids, xv, which, world=1)
    with torch.no_grad():
        got = code_logprobs(policy, batch)
        per = got.per_render(len(which))
        for row, i in enumerate(which):
            alone = policy(layout_batch(seqs, ids, xv, [i], world=1))
            want = -(alone["talker_sum"] + alone["subtalker_sum"])
            assert per[row].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-4)
            codes = int(alone["talker_tokens"].item() + alone["subtalker_tokens"].item())
            assert int((got.render == row).sum()) == codes
    assert bool((got.values <= 0).all())


def test_group_advantage_is_the_groups_standard_score() -> None:
    rewards = torch.tensor([[0.1, 0.5, 0.3, 0.9], [2.0, 2.0, 2.0, 2.0]])
    got = group_advantages(rewards)
    for p, group in enumerate(rewards.tolist()):
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / len(group))
        for g, r in enumerate(group):
            assert got[p, g].item() == pytest.approx((r - mean) / (std + 1e-6), abs=1e-5)
    assert torch.equal(got[1], torch.zeros(4))  # all alike: nothing to learn


def _reference_loss(new: list[float], old: list[float], ref: list[float], render: list[int],
                    adv: list[float], clip: float, beta: float) -> tuple[float, float]:
    """The objective written out code by code."""
    per_render: dict[int, list[float]] = {}
    kls = []
    for n, o, r, i in zip(new, old, ref, render, strict=True):
        ratio = math.exp(n - o)
        surrogate = min(ratio * adv[i], max(1 - clip, min(1 + clip, ratio)) * adv[i])
        kl = math.exp(r - n) - (r - n) - 1
        kls.append(kl)
        per_render.setdefault(i, []).append(surrogate - beta * kl)
    means = [sum(v) / len(v) for _, v in sorted(per_render.items())]
    return -sum(means) / len(means), sum(kls) / len(kls)


def test_clipped_objective_and_kl_equal_the_written_out_sum() -> None:
    g = torch.Generator().manual_seed(3)
    render = torch.tensor([0] * 5 + [1] * 9 + [2] * 3)
    old = -torch.rand(len(render), generator=g) * 3
    new = old + (torch.rand(len(render), generator=g) - 0.5)  # ratios 0.6..1.65: some clip
    ref = old + (torch.rand(len(render), generator=g) - 0.5) * 0.2
    adv = torch.tensor([1.2, -0.7, 0.3])
    terms = grpo_loss(CodeLogprobs(new, render), old, ref, adv, clip=0.2, beta=0.05)
    want, kl = _reference_loss(new.tolist(), old.tolist(), ref.tolist(), render.tolist(),
                               adv.tolist(), 0.2, 0.05)
    assert terms.loss.item() == pytest.approx(want, rel=1e-5)
    assert terms.kl.item() == pytest.approx(kl, rel=1e-5)
    assert 0.0 < terms.clipped.item() < 1.0


def test_on_policy_the_gradient_is_the_advantage_weighted_log_likelihood(
        policy: Any, tiny_model_dir: Path) -> None:
    """With the policy that sampled the codes and the reference equal to it, the ratio is
    1 and the KL's gradient 0: the update is -mean_i A_i mean_t grad log p(code_t)."""
    seqs, ids, xv = layout_sequences(tiny_model_dir)
    batch = layout_batch(seqs, ids, xv, [0, 1, 2], world=1)
    adv = torch.tensor([1.0, -0.5, 0.25])
    params = [p for p in policy.parameters() if p.requires_grad]

    policy.zero_grad()
    lp = code_logprobs(policy, batch)
    frozen = lp.values.detach()
    grpo_loss(lp, frozen, frozen, adv).loss.backward()
    got = [p.grad.clone() for p in params]

    policy.zero_grad()
    lp = code_logprobs(policy, batch)
    counts = torch.bincount(lp.render, minlength=3).to(lp.values.dtype)
    per = torch.zeros(3).index_add(0, lp.render, lp.values) / counts
    (-(adv * per).mean()).backward()
    want = [p.grad.clone() for p in params]
    policy.zero_grad()
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert any(a.abs().sum() > 0 for a in got)


def test_batch_on_device_keeps_the_host_built_rows(policy: Any, tiny_model_dir: Path) -> None:
    """The training loader's host-built gather rows give the same log-probabilities as
    the fallback that finds them on the device."""
    seqs, ids, xv = layout_sequences(tiny_model_dir)
    batch = layout_batch(seqs, ids, xv, [2, 3], world=1)
    plain = {k: v for k, v in batch.items() if k not in ("talker_rows", "frame_rows")}
    with torch.no_grad():
        a = code_logprobs(policy, batch)
        b = code_logprobs(policy, batch_to_device(plain, "cpu"))
    assert torch.equal(a.render, b.render) and torch.allclose(a.values, b.values)
