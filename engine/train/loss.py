"""The corrected Qwen3-TTS fine-tuning loss, as plain functions on tensors.

`VoiceObjective` (objective.py) runs the model and calls these. Upstream's
`sft_12hz.py` gets the loss wrong four ways (facts file); the fixes live here
and in `VoiceObjective.embed` / `subtalker_logits`:

1. text embeddings pass through `talker.text_projection` (objective.embed);
2. `talker_ce`: position q is scored against the codebook-0 token at q+1,
   shifted exactly once, here, and nowhere else;
3. `frame_inputs`: the sub-talker of the frame at position p gets the talker
   hidden state at p-1 (the one that predicted its codebook 0);
4. `subtalker_ce`: head i (1..15) against codebook i, no second shift.

Normalisation: sums are divided by the token count of the whole optimizer
step over all ranks and micro-batches, times the number of ranks (FSDP
averages gradients over ranks). So a batch split over any number of ranks or
micro-batches gives the gradient of one big batch (see `normalisers`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: weight of the sub-talker loss in the total (upstream and the paper use 0.3)
SUBTALKER_WEIGHT = 0.3


def talker_ce(hidden: torch.Tensor, codec_head: torch.nn.Module, codec_ids: torch.Tensor,
              target_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed codebook-0 cross-entropy and its token count.

    hidden (B, L, D) talker outputs; codec_ids (B, L) the codec channel;
    target_mask (B, L) True where the token AT that position is a target.
    The logits at q predict the token at q+1: one shift, done here.
    """
    mask = target_mask[:, 1:]
    # Only targeted rows go through the 3072-way head: the prompt is never scored.
    logits = codec_head(hidden[:, :-1][mask]).float()
    targets = codec_ids[:, 1:][mask]
    total = F.cross_entropy(logits, targets, reduction="sum")
    return total, torch.tensor(float(targets.numel()), device=total.device)


def frame_inputs(hidden: torch.Tensor, codec_ids: torch.Tensor, sub_codes: torch.Tensor,
                 frame_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(prev_hidden (F, D), codes (F, 16)) for every audio frame of the batch.

    prev_hidden is the talker output at the position BEFORE each frame.
    """
    mask = frame_mask[:, 1:]
    prev = hidden[:, :-1][mask]
    codes = torch.cat([codec_ids[:, 1:][mask].unsqueeze(-1), sub_codes[:, 1:][mask]], dim=-1)
    return prev, codes


def subtalker_ce(logits: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of logits (F, 15, V) from heads 1..15 against codebooks 1..15."""
    targets = codes[:, 1:]
    total = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                            reduction="sum")
    return total, torch.tensor(float(targets.numel()), device=total.device)


def combine(talker_sum: torch.Tensor, talker_norm: torch.Tensor, sub_sum: torch.Tensor,
            sub_norm: torch.Tensor, weight: float = SUBTALKER_WEIGHT) -> torch.Tensor:
    """The loss to backpropagate: talker mean + weight x sub-talker mean."""
    return talker_sum / talker_norm.clamp(min=1) + weight * sub_sum / sub_norm.clamp(min=1)


def normalisers(step_talker_tokens: int, step_subtalker_tokens: int,
                world: int) -> tuple[float, float]:
    """Per-rank divisors for one optimizer step.

    The step's total target counts (all ranks, all micro-batches) divided by
    the ranks: FSDP averages gradients over ranks, so each rank's sum over
    this divisor, averaged, is the full-batch mean.
    """
    if world < 1:
        raise ValueError("world must be >= 1")
    return step_talker_tokens / world, step_subtalker_tokens / world
