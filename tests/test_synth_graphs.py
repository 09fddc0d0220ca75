"""The frame the CUDA-graph path captures, checked on the CPU.

A CUDA graph replays kernels only: a frame that syncs with the host (reading a
value back, `.item()`, `bool(tensor)`, `nonzero`) cannot be captured, and one
that makes a tensor from a Python value (`torch.tensor(...)`, indexed
assignment of a scalar, which copies a host tensor to the device) bakes that
copy's source into the graph. A torch dispatch mode sees every aten call of
one frame, so both are caught here without a GPU.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.model.loading import load_model
from engine.synth.decoding import DecodeSettings, FastTalker
from engine.synth.prompt import build_prefill
from engine.synth.sampling import SamplerSettings, choose

ROOT = Path(__file__).resolve().parent.parent
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


def test_a_failed_capture_is_remembered_per_span(fast: tuple[FastTalker, Any],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Forced failure (capture itself needs a GPU; the bookkeeping around it does not):
    one attempt for the span, one warning, and every frame still runs, eagerly."""
    talker, official = fast
    greedy = SamplerSettings(do_sample=False)
    rows = _warm_rows(talker, official, DecodeSettings(talker=greedy, predictor=greedy))
    attempts: list[int] = []

    def broken(frame: Any) -> Any:
        attempts.append(1)
        raise RuntimeError("forced capture failure")

    rows._record = broken
    span = rows.span_for(int(rows.slot.max()))
    step = rows.step.clone()
    with torch.inference_mode(), caplog.at_level(logging.WARNING, logger="engine.synth.rows"):
        for _ in range(6):
            rows.run(span, graphs=True)
    assert len(attempts) == 1 and rows.capture_attempts == 1
    assert rows.failed == {span} and rows.graph_status == "failed"
    assert len([r for r in caplog.records if "capture failed" in r.getMessage()]) == 1
    assert torch.equal(rows.step, step + 6)  # warm-up, failed capture, 4 eager frames
    # another span is still tried (failures are per span)
    other = next(s for s in rows.spans() if s != span)
    with torch.inference_mode():
        rows.run(other, graphs=True)
        rows.run(other, graphs=True)
    assert len(attempts) == 2 and rows.failed == {span, other}
    assert rows.spans() == [64, 128, 256, 512, 1024][:len(rows.spans())]
    assert talker.prepare(DecodeSettings()) is None  # capture at load: CUDA only


def test_the_gpu_speech_proof_says_in_one_line_when_there_is_no_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the proof runs for real (bench/gpu_speech_proof.py)")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_speech_proof.py")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "no GPU" in lines[0]


def test_sampling_values_are_row_data_not_part_of_the_batch_shape(
        fast: tuple[FastTalker, Any]) -> None:
    talker, _ = fast
    plain = DecodeSettings()
    warmer = DecodeSettings(talker=SamplerSettings(temperature=1.3, top_p=0.8),
                            predictor=SamplerSettings(temperature=0.7),
                            repetition_penalty=1.2, min_new_tokens=4)
    a = talker.row_batch(2, 100, 20, 40, plain, 50)
    assert talker.row_batch(2, 100, 20, 40, warmer, 50) is a  # shared rows and graphs
    assert talker.row_batch(2, 100, 20, 40, DecodeSettings(
        talker=SamplerSettings(top_k=20)), 50) is not a  # top-k shapes the frame
    with pytest.raises(ValueError, match="another batch"):
        a.set_values([0], DecodeSettings(talker=SamplerSettings(do_sample=False)))
    a.set_values([1], warmer)
    assert a.t_sampler.temperature.flatten().tolist() == pytest.approx([0.9, 1.3])
    assert a.min_new.tolist() == [2, 4]
    # each row chooses exactly as the Python-valued sampler with its own values
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 300, generator=gen) * 3
    noise = torch.empty(2, 50).exponential_(generator=gen)
    picked = choose(scores, a.t_sampler, noise)
    for row, s in enumerate((plain.talker, warmer.talker)):
        assert torch.equal(picked[row:row + 1], choose(scores[row:row + 1], s, noise[row:row + 1]))
