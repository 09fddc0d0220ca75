"""Token choice for our decoding loop: the same filters, in the same order, as
Hugging Face `generate` applies for the official call, but batched, with one
random stream per row.

Order (transformers 4.57 `_get_logits_processor`): repetition penalty, the
end-of-speech ban during the first tokens, suppressed ids, then (sampling
only) temperature, top-k, top-p. Greedy is a plain argmax of the processed
scores, which is what makes our greedy output equal the official one.

Sampling draws with the "exponential race" (argmax of p / E with E ~ Exp(1)),
which picks token i with probability p_i exactly like `torch.multinomial`,
but lets every row use its own generator: a chunk's audio then depends only
on (seed, chunk), never on which other chunks shared its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSampler:
    """A sampler whose temperature and top-p are per-row device tensors ([B, 1]):
    a captured frame reads them as data, so one graph serves every value.
    `choose` takes it where it takes `SamplerSettings`."""

    do_sample: bool
    top_k: int
    temperature: torch.Tensor
    top_p: torch.Tensor


@dataclass(frozen=True)
class SamplerSettings:
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError("temperature must be > 0 when sampling")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables it)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


def noise_width(s: SamplerSettings, vocab: int) -> int:
    """How many noise values one draw needs: only the top-k survive filtering."""
    if not s.do_sample:
        return 0
    return min(s.top_k, vocab) if s.top_k else vocab


def _top_p_keep(sorted_desc: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Keep-mask over scores sorted high to low, as HF's TopPLogitsWarper decides.

    HF sorts ascending, drops tokens whose cumulative probability is
    <= 1 - top_p and always keeps the most likely one; same rule, flipped.
    """
    ascending = sorted_desc.flip(-1)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)
    drop[..., -1:].fill_(False)  # in place: no tensor made from a Python value
    return ~drop.flip(-1)


def _filtered(scores: torch.Tensor,
              s: SamplerSettings | RowSampler) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities over the surviving candidates, their token ids), best first."""
    row_values = isinstance(s.temperature, torch.Tensor)
    if row_values:
        # x / 1.0 is exact and top-p 1.0 drops nothing that has any probability:
        # the same choices as the Python-valued path
        scores = scores / s.temperature
    elif s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k and s.top_k < scores.shape[-1]:
        values, index = torch.topk(scores, s.top_k, dim=-1)  # sorted high to low
    else:
        values, index = torch.sort(scores, dim=-1, descending=True)
    if row_values:
        values = values.masked_fill(~_top_p_keep(values, s.top_p), float("-inf"))
    elif s.top_p < 1.0:
        values = values.masked_fill(~_top_p_keep(values, s.top_p), float("-inf"))
    return values.softmax(dim=-1), index


def probabilities(scores: torch.Tensor, s: SamplerSettings) -> torch.Tensor:
    """The full-vocabulary distribution `choose` samples from (for checks and tests)."""
    probs, index = _filtered(scores, s)
    return torch.zeros_like(scores).scatter(-1, index, probs)


def choose(scores: torch.Tensor, s: SamplerSettings | RowSampler,
           noise: torch.Tensor | None) -> torch.Tensor:
    """Pick one token per row of float32 `scores` [B, V].

    `noise` [B, >= noise_width] holds Exp(1) draws. With top-k the race runs
    over the k best scores only (all others have probability zero after
    HF's top-k filter anyway), so a draw costs k values, not the vocabulary.
    """
    if not s.do_sample:
        return scores.argmax(dim=-1)
    assert noise is not None
    probs, index = _filtered(scores, s)
    pick = (probs / noise[:, : probs.shape[-1]]).argmax(dim=-1, keepdim=True)
    return index.gather(-1, pick).squeeze(-1)


class RowStreams:
    """One `torch.Generator` per batch row, seeded from (seed, chunk index).

    Noise is drawn on the CPU generator (cheap, device independent, so a seed
    gives the same audio on CPU and GPU up to float rounding) and moved once
    per frame.
    """

    def __init__(self, seeds: list[int], device: torch.device) -> None:
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.device = device

    def draw(self, steps: int, width: int) -> torch.Tensor:
        """Exp(1) noise [B, steps, width] for one frame."""
        rows = [torch.empty(steps, width).exponential_(generator=g) for g in self.generators]
        # a zero draw would divide by zero; Exp(1) hits it with negligible probability
        noise = torch.stack(rows).clamp_min_(1e-20)
        return noise.to(self.device, non_blocking=True)
