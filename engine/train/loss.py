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

No host sync: the rows each loss scores are gathered with indices built on
the host from the batch's masks (`host_rows`, done by `batch_to_device`
before the batch reaches the device), with counts that come along with them.
Boolean-mask indexing on a GPU would stop the host once per mask (the result's
size lives on the device); it is only the fallback for callers that pass masks
alone.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

#: weight of the sub-talker loss in the total (upstream and the paper use 0.3)
SUBTALKER_WEIGHT = 0.3


def host_rows(mask: np.ndarray) -> np.ndarray:
    """Flat (B x L) indices of the positions q whose NEXT position is marked in `mask`.

    In row-major order, the same rows and order as `x[:, :-1][mask[:, 1:]]`.
    """
    length = mask.shape[1]
    bi, qi = np.nonzero(mask[:, 1:])
    return (bi * length + qi).astype(np.int64)


def _rows(mask: torch.Tensor) -> torch.Tensor:
    # fallback without host-built indices: nonzero's size is read back (one sync)
    length = mask.shape[1]
    bi, qi = torch.nonzero(mask[:, 1:], as_tuple=True)
    return bi * length + qi


def talker_ce(hidden: torch.Tensor, codec_head: torch.nn.Module, codec_ids: torch.Tensor,
              target_mask: torch.Tensor, rows: torch.Tensor | None = None,
              count: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed codebook-0 cross-entropy and its token count.

    hidden (B, L, D) talker outputs; codec_ids (B, L) the codec channel;
    target_mask (B, L) True where the token AT that position is a target.
    The logits at q predict the token at q+1: one shift, done here.
    rows / count: `host_rows(target_mask)` and its length, already on the device.
    """
    if rows is None:
        rows = _rows(target_mask)
    # Only targeted rows go through the 3072-way head: the prompt is never scored.
    logits = codec_head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)).float()
    targets = codec_ids.reshape(-1).index_select(0, rows + 1)
    total = F.cross_entropy(logits, targets, reduction="sum")
    if count is None:
        count = torch.tensor(float(targets.numel()), device=total.device)
    return total, count


def frame_inputs(hidden: torch.Tensor, codec_ids: torch.Tensor, sub_codes: torch.Tensor,
                 frame_mask: torch.Tensor, rows: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(prev_hidden (F, D), codes (F, 16)) for every audio frame of the batch.

    prev_hidden is the talker output at the position BEFORE each frame.
    rows: `host_rows(frame_mask)`, already on the device.
    """
    if rows is None:
        rows = _rows(frame_mask)
    prev = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
    at = rows + 1
    codes = torch.cat([codec_ids.reshape(-1).index_select(0, at).unsqueeze(-1),
                       sub_codes.reshape(-1, sub_codes.shape[-1]).index_select(0, at)], dim=-1)
    return prev, codes


def subtalker_ce(logits: torch.Tensor, codes: torch.Tensor,
                 count: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of logits (F, 15, V) from heads 1..15 against codebooks 1..15."""
    targets = codes[:, 1:]
    total = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                            reduction="sum")
    if count is None:
        count = torch.tensor(float(targets.numel()), device=total.device)
    return total, count


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
