"""The adapter pool's memory (issue 30): a slot no voice has taken costs no resident memory
on CPU; a pool made anew (more voices, a larger rank, the predictor's layers) holds its
voices' numbers and zeros wherever a row may still point, never what was left there; and
an adapter voice loaded from its folder costs its slot, not its file's tensors as well.

The layers are real `nn.Linear` projections of a Qwen3 decoder layer's names and widths
(at a size that makes a slot a few MB); the pool is the serving batch's own.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import psutil
import torch
from safetensors.torch import save_file
from torch import nn

from engine.layout.tiers import ADAPTER_INFO, ADAPTER_WEIGHTS, SPEAKER_ROW_KEY
from engine.model.adapter import FORMAT, load_adapter
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
    # slot 0 and the two written: 3 slots resident, not 64 (the rest allows for the
    # allocator's own keeping of the written values' temporaries)
    assert grown < 12 * slot_bytes, (grown / slot_bytes, "slots resident")
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


def test_adapter_voices_loaded_one_after_another_cost_their_slots_only(tmp_path: Path) -> None:
    """As the worker loads a voice: read its folder, write it into the pool, keep its
    speaker row. The row as loaded sat in the C heap above the file's hundreds of small
    tensors and kept them resident after they were freed: each voice cost its slot twice."""
    layers = [_layer() for _ in range(LAYERS)]
    folders = []
    for v in range(8):
        folder = tmp_path / f"voice-{v}"
        folder.mkdir()
        tensors = _adapter(layers, v)
        tensors[SPEAKER_ROW_KEY] = torch.randn(HIDDEN)
        save_file(tensors, str(folder / ADAPTER_WEIGHTS))
        (folder / ADAPTER_INFO).write_text(json.dumps({"format": FORMAT, "rank": RANK,
                                                       "alpha": 2 * RANK}))
        folders.append(folder)
    adapters = Adapters(layers, torch.device("cpu"), torch.float32)
    rows = []

    def load(folder: Path) -> None:
        voice = load_adapter(folder)
        adapters.add(str(folder), voice.tensors, voice.scaling, folder.name)
        rows.append(voice.x_vector)  # what the voice keeps (`RowVoice.speaker_vector`)

    load(folders[0])
    load(folders[1])
    start = _resident()
    for folder in folders[2:]:
        load(folder)
    per_voice = (_resident() - start) / 6
    slot_bytes = adapters.pool.bytes_per_slot()
    # a voice's slot (the pool's spare capacity is never touched), not that and its file
    # again: 1.0 slot a voice measured, 2.0 before the fix
    assert per_voice < 1.5 * slot_bytes, (per_voice / slot_bytes, "slots a voice")
    assert all(r.shape == (HIDDEN,) for r in rows)
