"""Faster CPU decoding as an option: int8 weights and fused projections.

On a CPU the 0.6B step is bound by reading weights (qwen3-tts-facts.md:
the predictor's 75 small layer passes per frame). Measured on this kind of
machine (one thread, a 1024 x 3072 projection, one row): fp32 2.9 ms, the
weight-only int8 kernel `aten._weight_int8pack_mm` 10.7 ms (slower: no fast
path here), fbgemm's int8 kernel with activations quantized per call 0.25 ms.
So `int8` stores each projection's weights as int8 with one scale per output
channel and runs fbgemm's dynamic kernel with the activations quantized per
ROW (one kernel call per row): fbgemm's own per-tensor activation scale would
let one row's outlier channel coarsen every other row of the batch (a row's
error went from 1.8 % to 15 %), so a sentence would sound different depending
on what else is being spoken. Per row, a row's numbers are the same whatever
shares its batch (tests/test_synth_cpu_speed.py). It changes the numbers, so
it is never the default; bench/bench_synth.py measures its teacher-forced
agreement with fp32 (per-step logits: relative error, top-1, KL).

`fp16` stores each projection's weights in half precision and runs fbgemm's
fp16 kernel (weights widened on the fly, fp32 activations and accumulation):
half the weight bytes of fp32 with no activation quantization, so a row's
numbers never depend on its batch, and the weights round to 11 significant
bits (relative error per projection about 2e-4, against 3e-3 for bf16 and
int8's per-row activation rounding). Measured on this kind of machine (one
thread, one row): 1024 x 3072 fp32 0.60 ms, fp16 0.38 ms, bf16 0.80 ms.

On CPUs with native bf16 (AVX-512 BF16, AMX) `--dtype bfloat16` is the other
batch-independent option: half the weight bytes of fp32, no quantization.

`fuse` joins q/k/v and gate/up into one matrix each (one weight pass and one
call instead of three or two).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from engine.config.speak import QUANT_MODES
from engine.core.errors import InputError


class Int8Linear:
    """y = x W^T + b with W in int8 (per-output-channel scales), through fbgemm."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().to(torch.float32).cpu()
        scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).to(torch.float64)
        zeros = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # quantized tensor types are deprecated in favour of torchao (not installed);
            # fbgemm's kernels still take them in this torch release
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
        b = None if bias is None else bias.detach().to(torch.float32).cpu()
        self.packed = torch.ops.quantized.linear_prepack(qw, b)
        self.out_features = w.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.float32)
        run = torch.ops.quantized.linear_dynamic
        if flat.shape[0] == 1:
            y = run(flat, self.packed, True)
        else:
            # one activation scale per row: a row never depends on its batch
            y = torch.cat([run(row, self.packed, True) for row in flat.split(1)])
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


class Fp16Linear:
    """y = x W^T + b with W stored in fp16, through fbgemm (fp32 activations and sums)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().to(torch.float32).cpu()
        b = None if bias is None else bias.detach().to(torch.float32).cpu()
        self.packed = torch.ops.quantized.linear_prepack_fp16(w, b)
        self.out_features = w.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # nothing is quantized per call, so the whole batch goes in one call
        flat = x.reshape(-1, x.shape[-1]).to(torch.float32)
        y = torch.ops.quantized.linear_dynamic_fp16(flat, self.packed)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


#: the packed projection of each `--quantize` mode
PACKED = {"int8": Int8Linear, "fp16": Fp16Linear}


def linear(x: torch.Tensor, w: Any, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for a plain weight, or the quantized projection's own call."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    return w(x)


def check_mode(mode: str | None, device: torch.device) -> None:
    if mode is None:
        return
    if mode not in QUANT_MODES:
        raise InputError(f"Unknown quantization {mode!r}.",
                         f"Use one of: {', '.join(QUANT_MODES)}.")
    if device.type != "cpu":
        raise InputError(f"{mode} decoding is a CPU option (fbgemm kernels).",
                         "Leave quantization off on a GPU: bf16 is faster there.")
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise InputError(f"This PyTorch build has no fbgemm {mode} kernels.",
                         "Leave quantization off.")


def convert_layers(layers: list[Any], mode: str | None, fuse: bool) -> list[Any]:
    """New `_Layer` records with fused and/or int8 projections (the model is untouched)."""
    out = []
    for layer in layers:
        changes: dict[str, Any] = {}
        if fuse:
            qkv = torch.cat((layer.q, layer.k, layer.v))
            biases = (layer.q_bias, layer.k_bias, layer.v_bias)
            qkv_bias = (None if all(b is None for b in biases) else torch.cat(
                [b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
                 for b, w in zip(biases, (layer.q, layer.k, layer.v), strict=True)]))
            changes.update(qkv=qkv, qkv_bias=qkv_bias,
                           qkv_split=(layer.q.shape[0], layer.k.shape[0], layer.v.shape[0]),
                           gate_up=torch.cat((layer.gate, layer.up)))
        if mode is not None:
            pack = PACKED[mode]
            for name in ("q", "k", "v", "o", "gate", "up", "down"):
                bias = getattr(layer, f"{name}_bias", None)
                changes[name] = pack(getattr(layer, name), bias)
                if bias is not None:
                    changes[f"{name}_bias"] = None  # folded into the packed projection
            if fuse:
                changes["qkv"] = pack(changes["qkv"], changes["qkv_bias"])
                changes["qkv_bias"] = None
                changes["gate_up"] = pack(changes["gate_up"])
        out.append(dataclasses.replace(layer, **changes))
    return out
