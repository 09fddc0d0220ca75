"""The frame the CUDA-graph path captures, checked on the CPU.

A CUDA graph replays kernels only: a frame that syncs with the host (reading a
value back, `.item()`, `bool(tensor)`, `nonzero`) cannot be captured, and one
that makes a tensor from a Python value (`torch.tensor(...)`, indexed
assignment of a scalar, which copies a host tensor to the device) bakes that
copy's source into the graph. A torch dispatch mode sees every aten call of
one frame, so both are caught here without a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.model.loading import load_model
from engine.synth.decoding import DecodeSettings, FastTalker
from engine.synth.prompt import build_prefill
from engine.synth.sampling import SamplerSettings

TEXTS = ["Hello world, this is a test.", "A second and somewhat longer row of text here."]

#: aten calls that wait for the device (the result comes back to the host)
SYNCS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "nonzero_static", "equal",
         "masked_select", "unique", "_unique2", "unique_consecutive", "allclose", "tolist"}
#: aten calls that make a tensor out of Python values
#: (a dtype change, `_to_copy`, is fine on the device; a device change cannot be seen on
#: the CPU, but every host value enters through one of these)
FROM_PYTHON = {"lift_fresh", "lift_fresh_copy", "scalar_tensor", "arange", "full",
               "randperm", "linspace"}


class Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...], Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.calls.append((func.overloadpacket.__name__, args, out))
        return out

    def names(self) -> set[str]:
        return {name for name, _, _ in self.calls}

    def bad(self) -> tuple[set[str], set[str]]:
        return self.names() & SYNCS, self.names() & FROM_PYTHON


@pytest.fixture(scope="module")
def fast(tiny_model_dir: Path) -> tuple[FastTalker, Any]:
    official = load_model(tiny_model_dir, device="cpu")
    return FastTalker(official.model), official


def _warm_rows(fast: FastTalker, official: Any, settings: DecodeSettings) -> Any:
    speaker = torch.randn(official.model.config.talker_config.hidden_size,
                          generator=torch.Generator().manual_seed(1))
    prefill = build_prefill(official.model, official.processor, TEXTS, speaker, None, False)
    fast.generate(prefill, [6, 6], settings, seeds=[1, 2], static=True)
    rows = next(reversed(fast._row_batches.values()))
    return rows


@pytest.mark.parametrize("sampled", [False, True])
def test_the_captured_frame_never_syncs_and_makes_no_host_tensor(
        fast: tuple[FastTalker, Any], sampled: bool) -> None:
    talker, official = fast
    greedy = SamplerSettings(do_sample=False)
    settings = DecodeSettings() if sampled else DecodeSettings(talker=greedy, predictor=greedy)
    rows = _warm_rows(talker, official, settings)
    span = rows.span_for(int(rows.slot.max()))
    with torch.inference_mode(), Recorder() as rec:
        rows.frame(span)
    syncs, made = rec.bad()
    assert not syncs, f"host syncs in the frame: {syncs}"
    assert not made, f"tensors made from Python values in the frame: {made}"
    assert len(rec.calls) > 100  # the whole frame really ran under the recorder
    # attention reads only the filled part of the cache, and the K/V heads as stored
    kv_heads = talker.t_stack.kv_heads
    talker_attn = [args for name, args, _ in rec.calls
                   if "scaled_dot_product" in name and args[1].shape[2] > 16]
    assert talker_attn
    for args in talker_attn:
        assert args[1].shape[2] == span < rows.capacity
        assert args[1].shape[1] == kv_heads < talker.t_stack.heads
    # no copy of a K/V cache was made for the grouped heads
    assert "repeat_interleave" not in rec.names()


def test_the_recorder_catches_what_a_graph_cannot_hold(fast: tuple[FastTalker, Any]) -> None:
    seen = torch.zeros(2, 8, dtype=torch.bool)
    token = torch.tensor([1, 3])
    with Recorder() as rec:
        seen[torch.arange(2), token] = True  # indexed assignment of a Python scalar
    assert rec.bad()[1]
    with Recorder() as rec:
        bool(seen.any())  # the host waits for the device
    assert rec.bad()[0]
    with Recorder() as rec:
        seen.scatter_(1, token[:, None], True)  # what the frame does instead
    assert rec.bad() == (set(), set())


def test_buffers_and_graphs_are_cached_per_batch_shape(fast: tuple[FastTalker, Any]) -> None:
    talker, _ = fast
    settings = DecodeSettings(talker=SamplerSettings(do_sample=False),
                              predictor=SamplerSettings(do_sample=False))
    a = talker.row_batch(2, 100, 20, 40, settings, 1)
    b = talker.row_batch(2, 120, 30, 50, settings, 1)  # rounds to the same shape
    c = talker.row_batch(3, 100, 20, 40, settings, 1)
    assert a is b and a is not c
    assert a.span_for(10) == 64 and a.span_for(64) == 128 and a.span_for(10_000) == a.capacity
