"""GRPO iterations in one process: rollouts from the policy, rewards, the group advantage,
then the clipped update against the old policy with a KL penalty to a frozen reference.

`Grpo.iteration` is one iteration of the stage (`engine.reinforce.session` runs them with
checkpoints, prompts and metrics); `run_iterations` repeats it on fixed texts. A reward
scores a list of renders; the stage's (`engine.reinforce.reward`) measures the renders'
audio with the evaluation's own measures. The settings are `ReinforceConfig`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.config.reinforce import ReinforceConfig
from engine.reinforce.rollout import Render, Roller
from engine.train.grpo import code_logprobs, group_advantages, grpo_loss

#: a reward: the renders of an iteration and its texts -> one score per render, either a
#: number or a dict with "reward" and the terms it was made of (each logged per iteration)
Reward = Callable[[list[Render], list[str]], Sequence[float] | Sequence[dict[str, float]]]


def iteration_seed(cfg: ReinforceConfig, iteration: int) -> int:
    """The seed of iteration `iteration`'s renders (0-based): a resumed stage draws the
    same renders as the uninterrupted one."""
    return int(cfg.seed) * 1000003 + iteration


@dataclass
class Grpo:
    """One process's GRPO: the policy (updated in place, its talker shared with the
    roller's decoder), the frozen reference, the roller, the reward and the optimizer."""

    policy: torch.nn.Module
    reference: torch.nn.Module
    roller: Roller
    reward: Reward
    cfg: ReinforceConfig
    optimizer: torch.optim.Optimizer | None = None

    def __post_init__(self) -> None:
        if self.optimizer is None:
            self.optimizer = make_optimizer(self.policy, self.cfg)

    def iteration(self, it: int, texts: list[str]) -> dict[str, float]:
        """Iteration `it` (0-based) on `texts`: sample, score, update; its figures (reward
        mean and spread within groups, each term's mean, KL, clipped share, loss)."""
        cfg, device = self.cfg, next(self.policy.parameters()).device
        renders = self.roller.sample(texts, cfg.group, cfg.max_frames,
                                     seed=iteration_seed(cfg, it))
        scored = [s if isinstance(s, dict) else {"reward": float(s)}
                  for s in self.reward(renders, texts)]
        scores = torch.tensor([s["reward"] for s in scored], dtype=torch.float32)
        grouped = scores.view(len(texts), cfg.group)
        adv = group_advantages(grouped).reshape(-1).to(device)
        batch = self.roller.batch(texts, renders, device)
        with torch.no_grad():
            old = code_logprobs(self.policy, batch).values
            ref = code_logprobs(self.reference, batch).values
        assert self.optimizer is not None
        for _ in range(cfg.updates):
            terms = grpo_loss(code_logprobs(self.policy, batch), old, ref, adv,
                              clip=cfg.clip, beta=cfg.beta)
            self.optimizer.zero_grad(set_to_none=True)
            terms.loss.backward()
            self.optimizer.step()
        row = {"iteration": float(it + 1), "reward": float(scores.mean()),
               "reward_spread": float(grouped.std(dim=1, unbiased=False).mean()),
               "kl": float(terms.kl), "clipped": float(terms.clipped),
               "loss": float(terms.loss.detach())}
        for key in scored[0]:
            if key != "reward":
                row[key] = float(sum(s[key] for s in scored) / len(scored))
        return row


def make_optimizer(policy: torch.nn.Module, cfg: ReinforceConfig) -> torch.optim.Optimizer:
    """The stage's AdamW over the policy's trainable parameters (no weight decay: the KL
    to the reference is what holds the policy near it)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)


def run_iterations(policy: torch.nn.Module, reference: torch.nn.Module, roller: Roller,
                   texts: list[str], reward: Reward, cfg: ReinforceConfig,
                   on_iteration: Callable[[dict[str, float]], None] | None = None,
                   ) -> list[dict[str, float]]:
    """Run `cfg.iterations` GRPO iterations on the same texts; returns each one's
    figures (`Grpo.iteration`)."""
    grpo = Grpo(policy, reference, roller, reward, cfg)
    history: list[dict[str, float]] = []
    for it in range(cfg.iterations):
        row = grpo.iteration(it, texts)
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
