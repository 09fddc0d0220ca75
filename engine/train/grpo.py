"""GRPO's pieces for the reinforce stage (issue 33): the log-probabilities of sampled codes
under a policy, the group advantage, and the clipped objective with a KL penalty.

A rollout (one render of a prompt) is laid out as a training clip is
(`engine.data.layout.build_sequence`: the prompt's text ids and the sampled (T, 16)
codes), so one teacher-forced pass of the training objective's own pieces gives
every sampled code's log-probability: codebook 0 from the talker at each frame,
codebooks 1..15 from the code predictor. Those are the same positions and
targets the supervised loss scores (its cross-entropy sums are exactly minus
their sums), so the policy, the frozen reference and the old policy are read the
same way, and the update is a training step of the same sharded model.

The objective, per group of G renders of one prompt (DeepSeekMath's GRPO):
- advantage A_i = (r_i - mean(r)) / (std(r) + eps), std over the group (population);
- per sampled code t of render i: ratio rho = exp(logp_new - logp_old),
  surrogate min(rho A_i, clip(rho, 1 - eps_clip, 1 + eps_clip) A_i), and the KL
  estimate to the reference k3 = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1
  (unbiased, never negative);
- loss = -mean over renders of (mean over the render's codes of (surrogate - beta k3)):
  each render weighs the same whatever its length.
Codebook 0 and codebooks 1..15 are all codes of the render and weigh alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.train import loss
from engine.train.objective import VoiceObjective


@dataclass
class CodeLogprobs:
    """Log-probabilities of a batch's own codes: `values` (N,) one per sampled code (the
    talker's targets first: each frame's codebook 0 and the end of speech; then every
    frame's codebooks 1..15) and `render` (N,) the batch row each belongs to."""

    values: torch.Tensor
    render: torch.Tensor

    def per_render(self, renders: int) -> torch.Tensor:
        """Summed log-probability of each render (renders,): log p(render | prompt)."""
        out = self.values.new_zeros(renders)
        return out.index_add(0, self.render, self.values)


def code_logprobs(objective: torch.nn.Module, batch: Mapping[str, torch.Tensor]
                  ) -> CodeLogprobs:
    """Teacher-forced log-probabilities of every code of `batch` (a collated layout batch
    on the objective's device) under `objective` (a `VoiceObjective`)."""
    hidden = objective.talker_hidden(objective.embed(batch))  # type: ignore[operator]
    codec_ids = batch["codec_ids"]
    length = codec_ids.shape[1]
    rows = batch.get("talker_rows")
    if rows is None:
        rows = loss._rows(batch["target_mask"])
    head = objective.talker.codec_head  # type: ignore[union-attr]
    logits = head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)).float()
    targets = codec_ids.reshape(-1).index_select(0, rows + 1)
    talker = F.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
    frame_rows = batch.get("frame_rows")
    if frame_rows is None:
        frame_rows = loss._rows(batch["frame_mask"])
    prev, codes = loss.frame_inputs(hidden, codec_ids, batch["sub_codes"],
                                    batch["frame_mask"], frame_rows)
    sub_logits = objective.subtalker_logits(prev, codes).float()  # type: ignore[operator]
    sub = F.log_softmax(sub_logits, dim=-1).gather(2, codes[:, 1:, None])[..., 0]  # (F, 15)
    sub_render = (frame_rows // length)[:, None].expand_as(sub)
    return CodeLogprobs(values=torch.cat([talker, sub.reshape(-1)]),
                        render=torch.cat([rows // length, sub_render.reshape(-1)]))


class PolicyObjective(VoiceObjective):
    """The training objective whose forward gives `code_logprobs` of the batch ({"values",
    "render"}): the reinforce stage's policy under FSDP2, where only the root's forward
    gathers and reduces its own parameters (calling its pieces directly would not)."""

    def forward(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # type: ignore[override]
        lp = code_logprobs(self, batch)
        return {"values": lp.values, "render": lp.render}


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(prompts, G) rewards -> advantages normalised within each prompt's group. A group
    whose renders all scored alike gets zero: nothing to learn from it."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


@dataclass
class GrpoTerms:
    """The loss and what a person watches per iteration."""

    loss: torch.Tensor
    kl: torch.Tensor  # mean k3 over codes
    clipped: torch.Tensor  # share of codes whose ratio was clipped where it mattered


def grpo_loss(new: CodeLogprobs, old: torch.Tensor, ref: torch.Tensor,
              advantages: torch.Tensor, clip: float = 0.2, beta: float = 0.04) -> GrpoTerms:
    """The clipped objective with the KL penalty (module doc). `old` and `ref`: the same
    codes' log-probabilities under the policy that sampled them and the frozen
    reference (no gradient); `advantages` (renders,), one per batch row."""
    logp = new.values
    ratio = torch.exp(logp - old.detach())
    adv = advantages.detach().to(logp.dtype).index_select(0, new.render)
    plain = ratio * adv
    bounded = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
    surrogate = torch.minimum(plain, bounded)
    gap = ref.detach() - logp
    k3 = torch.exp(gap) - gap - 1.0
    per_code = surrogate - beta * k3
    renders = advantages.shape[0]
    counts = torch.zeros(renders, dtype=logp.dtype, device=logp.device).index_add(
        0, new.render, torch.ones_like(logp))
    sums = torch.zeros(renders, dtype=logp.dtype, device=logp.device).index_add(
        0, new.render, per_code)
    value = -(sums / counts.clamp(min=1.0)).mean()
    return GrpoTerms(loss=value, kl=k3.mean().detach(),
                     clipped=(bounded < plain).to(logp.dtype).mean().detach())
