"""The adapter pool's memory (issue 30): a slot no voice has taken costs no resident memory
on CPU, and a pool made anew (more voices, a larger rank, the predictor's layers) holds
its voices' numbers and zeros wherever a row may still point, never what was left there.

The layers are real `nn.Linear` projections of a Qwen3 decoder layer's names and widths
(at a size that makes a slot a few MB); the pool is the serving batch's own.
"""

from __future__ import annotations

import gc

import psutil
import torch
from torch import nn

from engine.synth.adapters import PROJECTIONS, AdapterPool, Adapters

HIDDEN, INTER, RANK, LAYERS = 512, 1536, 16, 12


def _layer() -> nn.Module:
    layer = nn.Module()
    layer.self_attn = nn.Module()
    layer.mlp = nn.Module()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        setattr(layer.self_attn, name, nn.Linear(HIDDEN, HIDDEN, bias=False))
    layer.mlp.gate_proj = nn.Linear(HIDDEN, INTER, bias=False)
    layer.mlp.up_proj = nn.Linear(HIDDEN, INTER, bias=False)
    layer.mlp.down_proj = nn.Linear(INTER, HIDDEN, bias=False)
    return layer


def _adapter(layers: list[nn.Module], seed: int, rank: int = RANK) -> dict[str, torch.Tensor]:
    """An adapter voice's tensors for every projection of every layer."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, layer in enumerate(layers):
        for proj in PROJECTIONS:
            out, inp = layer.get_submodule(proj).weight.shape
            key = f"talker.model.layers.{i}.{proj}"
            tensors[f"{key}.lora_A"] = torch.randn(rank, inp, generator=g)
            tensors[f"{key}.lora_B"] = torch.randn(out, rank, generator=g)
    return tensors


def _resident() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_slots_no_voice_has_taken_cost_no_resident_memory() -> None:
    layers = [_layer() for _ in range(LAYERS)]
    adapters = Adapters(layers, torch.device("cpu"), torch.float32)
    shapes = adapters.shapes
    before = _resident()
    pool = AdapterPool(shapes, 64, RANK, torch.device("cpu"), torch.float32)
    slot_bytes = pool.bytes_per_slot()
    assert slot_bytes > 4 << 20  # the pool is 64 slots of several MB: hundreds of MB
    for slot in (1, 2):
        pool.write(slot, {(li, pi): (torch.ones(RANK, i), torch.ones(o, RANK))
                          for li, layer in enumerate(shapes) for pi, (o, i) in enumerate(layer)},
                   1.0)
    grown = _resident() - before
    # slot 0 and the two written: 3 slots resident, not 64 (4 allows for the allocator)
    assert grown < 4 * slot_bytes, (grown / slot_bytes, "slots resident")
    assert torch.count_nonzero(pool.a[0][0][0]) == 0 and torch.count_nonzero(pool.b[3][6][0]) == 0
    assert bool((pool.a[5][2][2] == 1).all())


def test_a_pool_made_anew_keeps_its_voices_and_zeros_where_a_row_may_point() -> None:
    layers = [_layer() for _ in range(2)]
    adapters = Adapters(layers, torch.device("cpu"), torch.float32)
    slots = [adapters.add(f"v{i}", _adapter(layers, i), 0.5, f"v{i}") for i in range(3)]
    assert slots == [1, 2, 3] and adapters.pool is not None
    old = adapters.pool
    adapters.release(slots[2])  # v2 goes: slot 3 is free, and an idle row may still name it
    kept = {s: (old.a[1][4][s].clone(), old.b[1][4][s].clone()) for s in (1, 2)}
    # a larger rank makes the pool anew, with its voices in it
    big = adapters.add("wide", _adapter(layers, 9, rank=2 * RANK), 0.5, "wide")
    new = adapters.pool
    assert new is not old and new.rank == 2 * RANK and big == 3  # the free slot, reused
    for s, (a, b) in kept.items():
        assert torch.equal(new.a[1][4][s, :RANK], a) and torch.equal(new.b[1][4][s, :, :RANK], b)
        assert torch.count_nonzero(new.a[1][4][s, RANK:]) == 0
        assert torch.count_nonzero(new.b[1][4][s, :, RANK:]) == 0
    # written: the old pool's slots and the new voice's; a slot never written is never
    # in a row's index, so the new pool need not touch it
    assert new.written == {0, 1, 2, 3}

    # a free slot the old pool wrote comes over as zeros, not as the voice that left
    adapters.release(big)
    again = AdapterPool(new.shapes, new.slots + 4, new.rank, torch.device("cpu"), torch.float32)
    new.copy_into(again)
    assert again.written == {0, 1, 2, 3}
    assert all(torch.count_nonzero(again.a[li][pi][3]) == 0
               and torch.count_nonzero(again.b[li][pi][3]) == 0
               for li in range(2) for pi in range(len(PROJECTIONS)))
    assert torch.equal(again.a[0][0][1], new.a[0][0][1])
