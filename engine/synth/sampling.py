"""Token choice for our decoding loop: the same filters, in the same order, as
Hugging Face `generate` applies for the official call, but batched, with one
random stream per row.

Order (transformers 4.57 `_get_logits_processor`): repetition penalty, the
end-of-speech ban during the first tokens, suppressed ids, then (sampling
only) temperature, top-k, top-p. Greedy is a plain argmax of the processed
scores, which is what makes our greedy output equal the official one.

Sampling draws with the "exponential race" (argmax of p / E with E ~ Exp(1)),
which picks token i with probability p_i exactly like `torch.multinomial`,
but lets the noise be any function of the row: here it is counter-based
(`FrameNoise`), a pure function of (row key = seed + chunk index, frame,
codebook, candidate) computed on the model's device with integer tensor ops.
A chunk's audio then depends only on (seed, chunk), never on which other
chunks share its batch or which row it sits in, no generator state has to be
carried or replayed, nothing is drawn on the host or copied per frame, and a
captured CUDA graph computes each frame's noise itself from the row's frame
counter (a device tensor).
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


#: candidates of one codebook are numbered within this stride, so a noise value
#: never depends on how many candidates a batch's settings keep (top-k)
_STRIDE = 1 << 16
_MASK32 = 0xFFFFFFFF
#: keys are folded into int64 device tensors: non-negative, below 2**63
KEY_MASK = (1 << 63) - 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """The low 32 bits of x * c for 32-bit x and c, without ever leaving int64's
    positive range (signed overflow is not something to rely on across devices):
    c is split into 16-bit halves, so no product exceeds 2**48."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply, two rounds; the
    constants are a well-known low-bias pair). Every step is exact integer
    arithmetic on values below 2**48, so CPU and GPU compute the same bits."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


class FrameNoise:
    """Exp(1) noise as a pure function of (row key, frame, codebook, candidate).

    `keys` are int64 [B] (`row_keys`); `frame` an int64 [B] tensor (each row at
    its own frame: continuous batching) or a Python int. The candidate index
    table is made once here, so `draw` makes no tensor from a Python value and
    can run inside a captured frame.
    """

    def __init__(self, groups: int, width: int, device: torch.device) -> None:
        if width > _STRIDE:
            raise ValueError(f"at most {_STRIDE} candidates per codebook")
        self.groups = groups
        self.width = max(width, 1)
        group = torch.arange(groups, device=device)[:, None] * _STRIDE
        self.index = (group + torch.arange(self.width, device=device)[None]).reshape(-1)

    def bits(self, keys: torch.Tensor, frame: torch.Tensor | int, first: int = 0,
             count: int | None = None) -> torch.Tensor:
        """The 32-bit hashes (int64 [B, count * width]) behind `draw`."""
        count = self.groups - first if count is None else count
        index = self.index[first * self.width:(first + count) * self.width]
        lo = keys & _MASK32
        hi = (keys >> 32) & _MASK32
        # the row: both halves of its key; the frame: mixed in per row
        row = _mix32(lo ^ _mix32(hi ^ 0x3C6EF372))
        at = _mix32(row ^ _mix32((frame + 0x9E3779B9) & _MASK32))
        return _mix32(_mix32(index[None] ^ at[:, None]) ^ row[:, None])

    def draw(self, keys: torch.Tensor, frame: torch.Tensor | int, first: int = 0,
             count: int | None = None) -> torch.Tensor:
        """float32 [B, count, width]: codebooks first..first+count of `frame`."""
        count = self.groups - first if count is None else count
        bits = self.bits(keys, frame, first, count)
        # 24 bits make float32 uniforms in (0, 1) exactly (never 0 or 1), so
        # -log(u) is finite and positive: no clamp needed
        u = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
        return u.log().neg_().view(keys.shape[0], count, self.width)


def row_keys(seeds: list[int], device: torch.device) -> torch.Tensor:
    """int64 [B] noise keys of rows seeded `seeds` (a row's seed is the request's
    seed + its chunk index)."""
    return torch.tensor([int(s) & KEY_MASK for s in seeds], dtype=torch.long, device=device)
