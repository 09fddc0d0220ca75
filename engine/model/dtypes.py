"""Which half-precision format a GPU computes in: one rule for training and speech."""

from __future__ import annotations

#: the first compute capability with native bf16 (Ampere: A100, RTX 30xx, and later)
BF16_CAPABILITY = (8, 0)


def gpu_half(capability: tuple[int, int] | None) -> str:
    """"bf16" on a GPU that has it, "fp16" on an older one (V100, T4, RTX 20xx), whose
    bf16 is emulated far too slowly or not at all. None (unknown): assumed modern."""
    return "bf16" if capability is None or tuple(capability) >= BF16_CAPABILITY else "fp16"
