"""GRPO iterations in one process: rollouts from the policy, rewards, the group advantage,
then the clipped update against the old policy with a KL penalty to a frozen reference.

A prompt may carry one of the run's trained styles as its instruction
(`iteration_styles`: off unless the settings weigh style obedience); its renders carry it.

`Grpo.iteration` is one iteration of the stage (`engine.reinforce.session` runs them with
checkpoints, prompts and metrics); `run_iterations` repeats it on fixed texts. A reward
scores a list of renders; the stage's (`engine.reinforce.reward`) measures the renders'
audio with the evaluation's own measures. The settings are `ReinforceConfig`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.config.reinforce import ReinforceConfig
from engine.reinforce.rollout import Render, Roller
from engine.train.grpo import CodeLogprobs, GrpoTerms, code_logprobs, group_advantages, grpo_loss

#: a reward: the renders of an iteration and its texts -> one score per render, either a
#: number or a dict with "reward" and the terms it was made of (each logged per iteration)
Reward = Callable[[list[Render], list[str]], Sequence[float] | Sequence[dict[str, float]]]


def iteration_seed(cfg: ReinforceConfig, iteration: int) -> int:
    """The seed of iteration `iteration`'s renders (0-based): a resumed stage draws the
    same renders as the uninterrupted one."""
    return int(cfg.seed) * 1000003 + iteration


def iteration_texts(pool: list[str], cfg: ReinforceConfig, it: int) -> list[str]:
    """Iteration `it`'s prompts: the next `cfg.prompts` of the pool, round and round."""
    return [pool[(it * cfg.prompts + k) % len(pool)] for k in range(int(cfg.prompts))]


def iteration_styles(styles: Sequence[str], cfg: ReinforceConfig, it: int
                     ) -> list[str | None]:
    """Iteration `it`'s instruction per prompt: with a style weight and a run trained with
    styles, `style_share` of the stage's prompts (spread evenly by their number) carry its
    styles in turn; the rest, and every prompt by default, none."""
    prompts = int(cfg.prompts)
    if not styles or cfg.style_weight <= 0 or cfg.style_share <= 0:
        return [None] * prompts
    out: list[str | None] = []
    for k in range(prompts):
        n = it * prompts + k  # the prompt's number in the stage: the same after a resume
        before = math.floor(n * cfg.style_share + 1e-9)
        styled = math.floor((n + 1) * cfg.style_share + 1e-9) > before
        out.append(styles[before % len(styles)] if styled else None)
    return out


@dataclass
class Rollout:
    """One iteration's renders, scored: the texts, the renders, each one's scores (a dict
    with "reward" and its terms) and advantage (relative to its text's group)."""

    texts: list[str]
    renders: list[Render]
    scored: list[dict[str, float]]
    advantages: torch.Tensor  # (renders,)

    def figures(self, group: int) -> dict[str, float]:
        """Reward mean, the groups' mean reward spread, each term's mean, and the share of
        renders the runaway guard cut ("runaway"; the reward counts them as capped)."""
        scores = torch.tensor([s["reward"] for s in self.scored], dtype=torch.float32)
        grouped = scores.view(len(self.texts), group)
        row = {"reward": float(scores.mean()),
               "reward_spread": float(grouped.std(dim=1, unbiased=False).mean()),
               "runaway": sum(r.runaway is not None for r in self.renders) / len(self.renders)}
        for key in self.scored[0]:
            if key != "reward":
                row[key] = float(sum(s[key] for s in self.scored) / len(self.scored))
        return row


def roll_out(roller: Roller, reward: Reward, cfg: ReinforceConfig, it: int,
             texts: list[str]) -> Rollout:
    """Iteration `it`'s renders (seeded by `it`) from the roller's current weights, scored,
    with their group advantages."""
    renders = roller.sample(texts, cfg.group, cfg.max_frames, seed=iteration_seed(cfg, it),
                            styles=iteration_styles(roller.styles, cfg, it))
    scored = [s if isinstance(s, dict) else {"reward": float(s)} for s in reward(renders, texts)]
    scores = torch.tensor([s["reward"] for s in scored], dtype=torch.float32)
    adv = group_advantages(scores.view(len(texts), cfg.group)).reshape(-1)
    return Rollout(texts, renders, scored, adv)


def update(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: ReinforceConfig,
           new_logprobs: Callable[[], CodeLogprobs], old: torch.Tensor, ref: torch.Tensor,
           adv: torch.Tensor) -> GrpoTerms:
    """`cfg.updates` optimizer steps of the clipped objective; the last step's terms.
    `new_logprobs()`: the batch's code log-probabilities under the policy as it is now."""
    terms: GrpoTerms | None = None
    for _ in range(int(cfg.updates)):
        terms = grpo_loss(new_logprobs(), old, ref, adv, clip=cfg.clip, beta=cfg.beta)
        optimizer.zero_grad(set_to_none=True)
        terms.loss.backward()
        optimizer.step()
    assert terms is not None
    return terms


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
        device = next(self.policy.parameters()).device
        rollout = roll_out(self.roller, self.reward, self.cfg, it, texts)
        batch = self.roller.batch(texts, rollout.renders, device)
        with torch.no_grad():
            old = code_logprobs(self.policy, batch).values
            ref = code_logprobs(self.reference, batch).values
        assert self.optimizer is not None
        terms = update(self.policy, self.optimizer, self.cfg,
                       lambda: code_logprobs(self.policy, batch), old, ref,
                       rollout.advantages.to(device))
        return {"iteration": float(it + 1), **rollout.figures(self.cfg.group),
                "kl": float(terms.kl), "clipped": float(terms.clipped),
                "loss": float(terms.loss.detach())}


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
    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    return ref.eval()
