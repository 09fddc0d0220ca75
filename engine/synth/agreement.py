"""How close a faster decoding option is to fp32, measured teacher-forced.

Comparing free-running codes says little: after the first different code the
two runs speak different things and every later frame differs. Here both
models read the SAME codes (the reference model's, or any given ones), frame
by frame, and the logits of every choice are compared: codebook 0 from the
talker and codebooks 1..15 from the code predictor, at every frame. Reported
over all choices: the relative error of the logits (L2, over the codes that
may be chosen), top-1 agreement, and the KL divergence of the fast option's
distribution from the reference's (temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.synth.decoding import PREDICTOR_POSITIONS, FastTalker, Prefill
from engine.synth.quant import linear


@dataclass(frozen=True)
class Agreement:
    choices: int
    rel_error: float  # mean over choices of |fast - ref| / |ref|
    top1: float  # fraction of choices with the same best code
    kl: float  # mean KL(ref || fast), nats

    def line(self) -> str:
        return (f"{self.choices} choices: logits rel. error {self.rel_error:.2%}, "
                f"top-1 agreement {self.top1:.2%}, KL {self.kl:.2e} nats")


@torch.inference_mode()
def teacher_forced_logits(fast: FastTalker, prefill: Prefill,
                          codes: torch.Tensor) -> torch.Tensor:
    """float32 logits [frames, 16, V] of every choice of one row, fed `codes` [F, 16].

    Talker logits (codebook 0) are cut to the predictor's vocabulary plus the
    end-of-speech id is dropped: what remains are the codes both may choose.
    """
    embeds = prefill.embeds.to(fast.device, fast.dtype)
    if embeds.shape[0] != 1:
        raise ValueError("teacher forcing takes one row")
    t0 = embeds.shape[1]
    frames = len(codes)
    codes = codes.to(fast.device)
    cos, sin = fast._talker_rope(t0 + frames + 1)
    t_cache = fast.t_stack.alloc(1, t0 + frames + 1, embeds)
    p_cache = fast.p_stack.alloc(1, PREDICTOR_POSITIONS, embeds)
    pos = torch.arange(t0, device=fast.device)[None]
    hidden = fast.t_stack.forward(embeds, cos[pos], sin[pos], t_cache, 0, None)
    past = hidden[:, -1:]
    trailing = prefill.trailing.to(fast.device, fast.dtype)
    tts_pad = prefill.tts_pad.to(fast.device, fast.dtype)
    out = torch.zeros(frames, fast.groups, fast.p_vocab)
    for f in range(frames):
        talker = linear(past, fast.head)[0, -1].to(torch.float32)
        out[f, 0] = talker[:fast.p_vocab].cpu()

        def forced(j: int, logits: torch.Tensor, f: int = f) -> torch.Tensor:
            out[f, j + 1] = logits[0].cpu()  # what the predictor thought ...
            return codes[f:f + 1, j + 1]  # ... and the code it is fed instead

        _, summed = fast.predict_codebooks(past, codes[f:f + 1, 0], p_cache, forced)
        text = trailing[:, f:f + 1] if f < trailing.shape[1] else tts_pad
        slot = t0 + f
        at = torch.tensor([[slot]], device=fast.device)
        past = fast.t_stack.forward(summed + text, cos[at], sin[at], t_cache, slot, None)
    return out


def compare_logits(ref: torch.Tensor, fast: torch.Tensor) -> Agreement:
    """Agreement of two [..., V] logit tensors (one choice per leading index)."""
    ref = ref.reshape(-1, ref.shape[-1]).double()
    fast = fast.reshape(-1, fast.shape[-1]).double()
    rel = (fast - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)
    top1 = (fast.argmax(1) == ref.argmax(1)).double()
    log_p = torch.log_softmax(ref, 1)
    log_q = torch.log_softmax(fast, 1)
    kl = (log_p.exp() * (log_p - log_q)).sum(1)
    return Agreement(choices=ref.shape[0], rel_error=float(rel.mean()),
                     top1=float(top1.mean()), kl=float(kl.mean()))
