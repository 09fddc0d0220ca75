"""CUDA graph captures run alone on the GPU (issue 29): the gate's protocol, and the
real batcher whose capture is replaced by a probe while its finisher decodes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.synth.capture import GATE, GpuGate


class Replay:
    """What the probe that stands in for a capture returns: replaying runs the frame."""

    def __init__(self, frame: Any) -> None:
        self.frame = frame

    def replay(self) -> None:
        self.frame()


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread never finished"


def test_a_capture_waits_for_other_sections_and_keeps_new_ones_out() -> None:
    gate = GpuGate()
    seen: list[set[int]] = []
    in_section = threading.Event()
    release = threading.Event()

    def decoder() -> None:
        with gate.section():
            in_section.set()
            release.wait(10)

    def capturer() -> None:
        with gate.section():  # the batcher captures from inside its own turn
            in_section.wait(10)
            with gate.capture():
                seen.append(gate.inside())
                time.sleep(0.05)  # a late section must not get in meanwhile
                seen.append(gate.inside())

    def late() -> None:
        in_section.wait(10)
        time.sleep(0.02)
        with gate.section():
            pass

    threads = [threading.Thread(target=f) for f in (decoder, capturer, late)]
    for t in threads:
        t.start()
    in_section.wait(10)
    time.sleep(0.1)
    assert not seen  # the capture is still waiting for the decoder
    release.set()
    _join(threads)
    assert seen == [set(), set()]  # nobody else inside while it captured


def test_two_threads_capturing_from_inside_their_sections_do_not_deadlock() -> None:
    gate = GpuGate()
    both_in = threading.Barrier(2)
    order: list[int] = []

    def worker() -> None:
        with gate.section():
            both_in.wait(10)
            with gate.capture():
                order.append(threading.get_ident())
                assert gate.inside() == set()
            with gate.section():  # nested after the capture: still its own
                pass

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    _join(threads)
    assert len(order) == 2


def test_the_batcher_captures_only_while_no_other_thread_is_on_the_gpu(
        tiny_model_dir: Path, piper_sentences: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request of new settings makes a new batch, whose frames are captured exactly
    while the finisher decodes the request before it (slowed down here): the probe that
    stands in for the capture fails if the decoder is running when it is called."""
    from engine.config.speak import SpeakOptions
    from engine.core.events import Emitter
    from engine.synth.batcher import BatchRequest, ContinuousBatcher
    from engine.synth.rows import RowBatch
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    source = resolve_source(tiny_model_dir, reference=Path(piper_sentences[0]["path"]),
                            x_vector_only=True)
    synth = Synthesizer.load(source, device="cpu", dtype="float32")
    decoding = threading.Event()
    real_decode = synth.decode_audio

    def slow_decode(codes: Any, **kw: Any) -> Any:
        decoding.set()
        try:
            time.sleep(0.5)
            return real_decode(codes, **kw)
        finally:
            decoding.clear()

    monkeypatch.setattr(synth, "decode_audio", slow_decode)
    captures: list[tuple[bool, set[int]]] = []

    def probe(self: RowBatch, frame: Any) -> Replay:
        me = threading.get_ident()
        captures.append((decoding.is_set(), GATE.inside() - {me}))
        return Replay(frame)

    monkeypatch.setattr(RowBatch, "_record", probe)
    done = threading.Semaphore(0)
    errors: list[BaseException] = []

    def finished(_result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            errors.append(exc)
        done.release()

    batcher = ContinuousBatcher(synth, rows=2, graphs=True)
    try:
        for rid, sample in (("greedy", False), ("sampled", True)):
            batcher.submit(BatchRequest(
                rid=rid, text="A short sentence.", out=str(tmp_path / f"{rid}.wav"),
                fmt="wav", options=SpeakOptions(seed=3, max_frames=6, do_sample=sample,
                                                subtalker_do_sample=sample,
                                                loudness_lufs=None),
                emitter=Emitter(None), done=finished))
        for _ in range(2):
            assert done.acquire(timeout=240)
    finally:
        batcher.close()
    assert not errors
    assert len(captures) >= 2, captures  # each batch captured its span
    assert all(not busy and not others for busy, others in captures), captures


def test_a_loaded_voice_is_frozen_and_its_batches_carry_no_autograd_history(
        tiny_model_dir: Path, piper_sentences: list[dict[str, Any]]) -> None:
    import torch

    from engine.config.speak import SpeakOptions
    from engine.synth.sampling import noise_width
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    source = resolve_source(tiny_model_dir, reference=Path(piper_sentences[0]["path"]),
                            x_vector_only=True)
    synth = Synthesizer.load(source, device="cpu", dtype="float32")
    assert not any(p.requires_grad for p in synth.model.parameters())
    fast = synth.fast
    settings = synth.decode_settings(SpeakOptions())
    width = max(noise_width(settings.talker, fast.vocab),
                noise_width(settings.predictor, fast.p_vocab), 1)
    rows = fast.row_batch(1, 64, 16, 32, settings, width)  # outside any inference mode
    held = [v for v in vars(rows).values() if isinstance(v, torch.Tensor)]
    held += [t for kv in rows.t_cache for t in kv]
    assert held and not any(t.requires_grad or t.grad_fn is not None for t in held)


def test_gpus_below_compute_capability_8_speak_in_fp16_as_training_computes() -> None:
    import torch

    from engine.synth.synthesizer import resolve_dtype
    from engine.train.precision import resolve_precision

    for cap, dtype, precision in (((7, 5), torch.float16, "fp16"),
                                  ((7, 0), torch.float16, "fp16"),
                                  ((8, 0), torch.bfloat16, "bf16"),
                                  ((9, 0), torch.bfloat16, "bf16")):
        assert resolve_dtype("auto", "cuda", capability=cap) == dtype
        assert resolve_precision("auto", "cuda", cap) == precision
    assert resolve_dtype("fp16", "cpu") == torch.float16


def test_alternating_default_and_greedy_requests_recapture_nothing(
        tiny_model_dir: Path, piper_sentences: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default and the greedy batches are captured at load and both kept: requests
    that switch between them reuse their graphs (one kept batch recaptured at each
    switch)."""
    from engine.config.speak import SpeakOptions
    from engine.core.events import Emitter
    from engine.synth.batcher import BatchRequest, ContinuousBatcher
    from engine.synth.rows import RowBatch
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    source = resolve_source(tiny_model_dir, reference=Path(piper_sentences[0]["path"]),
                            x_vector_only=True)
    synth = Synthesizer.load(source, device="cpu", dtype="float32")
    captured: list[int] = []

    def probe(self: RowBatch, frame: Any) -> Replay:
        captured.append(id(self))
        return Replay(frame)

    monkeypatch.setattr(RowBatch, "_record", probe)
    results: list[Any] = []
    done = threading.Semaphore(0)

    def finished(result: Any, exc: BaseException | None) -> None:
        results.append(exc or result)
        done.release()

    batcher = ContinuousBatcher(synth, rows=2, graphs=True)
    try:
        batcher.prepare()
        at_load = len(captured)
        assert at_load >= 2 and len(set(captured)) == 2  # two batches, every span
        for i, sample in enumerate((False, True, False, True)):
            batcher.submit(BatchRequest(
                rid=f"r{i}", text="A short sentence.", out=str(tmp_path / f"{i}.wav"),
                fmt="wav", options=SpeakOptions(seed=i, max_frames=6, do_sample=sample,
                                                subtalker_do_sample=sample,
                                                loudness_lufs=None),
                emitter=Emitter(None), done=finished))
            assert done.acquire(timeout=240)  # one after another: each switches batch
    finally:
        batcher.close()
    assert all(isinstance(r, dict) for r in results), results
    assert len(captured) == at_load  # nothing captured again


def test_the_predictors_folded_attention_equals_the_grouped_kernel(
        tiny_model_dir: Path) -> None:
    """On CUDA the code predictor folds its grouped query heads (so a fused attention
    kernel takes the masked pass); the fold is the same attention as the CPU's path."""
    import torch

    from engine.model.loading import load_model
    from engine.synth.decoding import FastTalker, _rope_table

    model = load_model(tiny_model_dir, device="cpu", dtype=torch.float32).model
    fast = FastTalker(model)
    stack = fast.p_stack
    assert stack.n_rep > 1  # the tiny model has grouped heads, as the released ones
    slots = torch.arange(16)
    masks = [(slots[None] <= slots[:2, None])[None, None]]  # the frame's first step: 2 rows
    masks += [(slots <= j)[None, None, None] for j in range(2, 16)]
    g = torch.Generator().manual_seed(0)
    hidden = model.talker.code_predictor.config.hidden_size
    outs = {}
    for fold in (False, True):
        stack.fold_full = fold
        cache = stack.alloc(3, 16, fast.head)
        cos, sin = _rope_table(fast.predictor.model.rotary_emb, 16, fast.head, axes=1)
        g.manual_seed(0)
        steps, start = [], 0
        for j, mask in enumerate(masks):
            t = 2 if j == 0 else 1
            h = torch.randn(3, t, hidden, generator=g)
            with torch.inference_mode():
                steps.append(stack.forward(h, cos[start:start + t][None],
                                           sin[start:start + t][None], cache, start,
                                           mask, full=True))
            start += t
        outs[fold] = torch.cat([s.reshape(3, -1) for s in steps], dim=1)
    assert torch.allclose(outs[True], outs[False], atol=1e-5, rtol=1e-4)
