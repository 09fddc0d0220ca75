"""GRPO iterations in one process: rollouts from the policy, rewards, the group advantage,
then the clipped update against the old policy with a KL penalty to a frozen reference.

`run_iterations` is the loop a stage runs (on Ray, its rollouts and scoring become actors
beside the sharded policy; this is the algorithm, whole, on one process). `reward`
scores a list of renders; the stage's reward terms are measured from the renders'
audio by the evaluation's own measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.reinforce.rollout import Render, Roller
from engine.train.grpo import code_logprobs, group_advantages, grpo_loss


@dataclass
class StageSettings:
    group: int = 4  # renders per prompt: the advantage is relative within them
    iterations: int = 30
    updates: int = 2  # optimizer steps per batch of rollouts (the ratio moves off 1)
    lr: float = 1e-4
    clip: float = 0.2
    beta: float = 0.04  # weight of the KL to the reference
    max_frames: int = 24


def run_iterations(policy: torch.nn.Module, reference: torch.nn.Module, roller: Roller,
                   texts: list[str], reward: Callable[[list[Render]], list[float]],
                   settings: StageSettings,
                   on_iteration: Callable[[dict[str, float]], None] | None = None,
                   ) -> list[dict[str, float]]:
    """Run `settings.iterations` GRPO iterations; returns each one's figures (reward mean
    and spread, KL, clipped share, loss)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    device = next(policy.parameters()).device
    history: list[dict[str, float]] = []
    for it in range(settings.iterations):
        renders = roller.sample(texts, settings.group, settings.max_frames, seed=it)
        scores = torch.tensor(reward(renders), dtype=torch.float32)
        grouped = scores.view(len(texts), settings.group)
        adv = group_advantages(grouped).reshape(-1).to(device)
        batch = roller.batch(texts, renders, device)
        with torch.no_grad():
            old = code_logprobs(policy, batch).values
            ref = code_logprobs(reference, batch).values
        for _ in range(settings.updates):
            terms = grpo_loss(code_logprobs(policy, batch), old, ref, adv,
                              clip=settings.clip, beta=settings.beta)
            opt.zero_grad(set_to_none=True)
            terms.loss.backward()
            opt.step()
        row = {"iteration": float(it + 1), "reward": float(scores.mean()),
               "reward_spread": float(grouped.std(dim=1, unbiased=False).mean()),
               "kl": float(terms.kl), "clipped": float(terms.clipped),
               "loss": float(terms.loss.detach())}
        history.append(row)
        if on_iteration is not None:
            on_iteration(row)
    return history


def frozen_copy(policy: torch.nn.Module) -> Any:
    """The reference: the policy as it starts, with no gradient."""
    import copy

    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    return ref.eval()
