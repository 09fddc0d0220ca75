"""LoRA adapters on the talker's attention and MLP projections (trainable "lora").

Each target `nn.Linear` (q, k, v, o, gate, up, down of every talker decoder
layer, and with `predictor` (`model.lora_predictor`) of every code predictor
decoder layer too: it carries codebooks 1-15) gets two parameters of its own,
``lora_A`` (rank x in) and ``lora_B`` (out x rank), and a forward hook that
adds ``(alpha / rank) * x A^T B^T`` to its output (in training, x with
``model.lora_dropout`` of it dropped, as peft does). The base weight keeps its
official name and stays frozen, so:
- the base weights load as before and state-dict keys stay the official
  ones plus ``<linear>.lora_A`` / ``.lora_B`` (no wrapper modules, no
  renamed ``base_layer`` keys as `peft` would make);
- the adapters sit inside their decoder layer's FSDP unit, sharded with it;
- export, and every path that speaks from a checkpoint, merges them,
  ``W + (alpha / rank) B A``, into official weights
  (`engine.model.checkpoint_weights.trained_weights`), so a LoRA checkpoint speaks
  exactly as its export.

Initialisation follows LoRA (and peft): A Kaiming-uniform, B zero, so the
first forward equals the base model's. A is drawn from a generator seeded by
the parameter's name: every rank, and a resumed or single-process run, draws
the same values without communicating.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator

import torch
from torch import nn

#: projections of a Qwen3 decoder layer that get adapters
TARGETS: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
SUFFIXES = (".lora_A", ".lora_B")


def is_lora_name(name: str) -> bool:
    return name.endswith(SUFFIXES)


def _lora_forward_hook(module: nn.Module, args: tuple[torch.Tensor, ...],
                       output: torch.Tensor) -> torch.Tensor:
    x = args[0]
    if module.training and module.lora_dropout > 0:
        # on the adapter's input alone: the frozen base sees every input
        x = nn.functional.dropout(x, module.lora_dropout, training=True)
    a, b = module.lora_A, module.lora_B
    update = nn.functional.linear(nn.functional.linear(x.to(a.dtype), a), b)
    return output + update.to(output.dtype) * module.lora_scaling


def target_modules(talker: nn.Module, predictor: bool = False
                   ) -> Iterator[tuple[str, nn.Linear]]:
    """(name relative to the talker, module) of every projection that gets an adapter:
    the talker's decoder layers', and with `predictor` the code predictor's too."""
    stacks = [("model.layers", talker.model.layers)]
    if predictor:
        stacks.append(("code_predictor.model.layers", talker.code_predictor.model.layers))
    for prefix, layers in stacks:
        for i, layer in enumerate(layers):
            for t in TARGETS:
                mod = layer.get_submodule(t)
                if isinstance(mod, nn.Linear):
                    yield f"{prefix}.{i}.{t}", mod


def add_lora(talker: nn.Module, rank: int, alpha: float, predictor: bool = False,
             dropout: float = 0.0) -> int:
    """Give every target projection an adapter (idempotent); returns how many there are.
    `dropout`: the share of the adapter's inputs dropped in training mode."""
    n = 0
    for _, mod in target_modules(talker, predictor):
        n += 1
        mod.lora_dropout = float(dropout)
        if hasattr(mod, "lora_A"):
            continue
        w = mod.weight
        mod.register_parameter("lora_A", nn.Parameter(
            torch.zeros(rank, mod.in_features, device=w.device, dtype=w.dtype)))
        mod.register_parameter("lora_B", nn.Parameter(
            torch.zeros(mod.out_features, rank, device=w.device, dtype=w.dtype)))
        mod.lora_scaling = float(alpha) / float(rank)
        mod.register_forward_hook(_lora_forward_hook)
    return n


def initial_value(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The starting value of adapter parameter `name` (full, fp32, on CPU), same on every rank."""
    if name.endswith(".lora_B"):
        return torch.zeros(shape, dtype=torch.float32)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    # nn.init.kaiming_uniform_(a=sqrt(5)) on (rank, in): bound = 1 / sqrt(in)
    bound = 1.0 / math.sqrt(shape[1])
    return (torch.rand(shape, generator=g, dtype=torch.float32) * 2.0 - 1.0) * bound
