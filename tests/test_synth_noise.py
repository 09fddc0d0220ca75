"""Sampling noise made on the device from (seed + chunk, frame, codebook, candidate).

The same seed must give the same speech whatever else is being spoken: a
chunk's noise may depend on nothing but its own key and frame, never on its
row, its batch's company, the batch's width (top-k) or when it joined a
running batch. These tests check the hash bit for bit against plain Python
integers, its distribution, and that the eager loop, the static (CUDA-graph)
frame and the warm worker's continuous batcher all use the same values.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.config.speak import SpeakOptions
from engine.core.events import Emitter
from engine.synth.batcher import BatchRequest, ContinuousBatcher
from engine.synth.decoding import DecodeSettings
from engine.synth.prompt import build_prefill
from engine.synth.sampling import FrameNoise, SamplerSettings, choose, row_keys
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from tests.helpers.parity import record_choices

CPU = torch.device("cpu")
M32 = 0xFFFFFFFF


def _mix(x: int) -> int:
    # the finaliser in unbounded Python integers (plain multiply, then mask)
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _reference_bits(key: int, frame: int, group: int, candidate: int) -> int:
    row = _mix((key & M32) ^ _mix(((key >> 32) & M32) ^ 0x3C6EF372))
    at = _mix(row ^ _mix((frame + 0x9E3779B9) & M32))
    return _mix(_mix(((group << 16) + candidate) ^ at) ^ row)


@pytest.mark.parity
def test_noise_bits_equal_plain_integer_arithmetic() -> None:
    noise = FrameNoise(16, 50, CPU)
    seeds = [0, 1, 12345, 2**31 - 1, 2**32 + 7, 2**62 + 3, 2**63 - 1]
    frames = torch.tensor([0, 1, 5, 700, 8191, 3, 2**20])
    bits = noise.bits(row_keys(seeds, CPU), frames).view(len(seeds), 16, 50)
    for r, seed in enumerate(seeds):
        for g, c in ((0, 0), (0, 49), (1, 7), (7, 21), (15, 0), (15, 49)):
            assert int(bits[r, g, c]) == _reference_bits(seed, int(frames[r]), g, c), (r, g, c)
    # a frame given as a Python int computes the same bits
    assert torch.equal(noise.bits(row_keys(seeds[:1], CPU), 700),
                       noise.bits(row_keys(seeds[:1], CPU), torch.tensor([700])))


@pytest.mark.parity
def test_a_rows_noise_depends_only_on_its_key_and_frame() -> None:
    narrow, wide = FrameNoise(16, 50, CPU), FrameNoise(16, 3072, CPU)
    keys = row_keys([4, 9, 4], CPU)
    together = narrow.draw(keys, torch.tensor([3, 0, 11]))
    for r, frame in enumerate((3, 0, 11)):
        alone = narrow.draw(keys[r:r + 1], frame)
        assert torch.equal(together[r], alone[0])
        # top-k changes how many candidates are drawn, never their values
        assert torch.equal(wide.draw(keys[r:r + 1], frame)[0, :, :50], alone[0])
    # slices of the codebooks are the same values as the whole frame
    assert torch.equal(narrow.draw(keys, 3, first=1), narrow.draw(keys, 3)[:, 1:])
    assert torch.equal(narrow.draw(keys, 3, count=1), narrow.draw(keys, 3)[:, :1])
    # the same key at frame 3 and 11 (rows 0 and 2) differ; so do keys 4 and 9
    assert not torch.equal(together[0], together[2])
    assert not torch.equal(narrow.draw(keys[:1], 0), narrow.draw(keys[1:2], 0))


def test_noise_is_exp1_and_races_with_the_right_frequencies() -> None:
    noise = FrameNoise(16, 64, CPU)
    keys = row_keys(list(range(400)), CPU)
    draws = torch.cat([noise.draw(keys, f) for f in range(4)])  # 1.6M values
    assert draws.min() > 0 and torch.isfinite(draws).all()
    assert abs(float(draws.mean()) - 1) < 0.01 and abs(float(draws.var()) - 1) < 0.02
    for t in (0.1, 1.0, 3.0, 8.0):
        assert float((draws > t).double().mean()) == pytest.approx(math.exp(-t), rel=0.03)
    # neighbouring keys, frames and candidates are uncorrelated
    flat = draws[:400]
    pairs = ((flat[:-1], flat[1:]), (flat, noise.draw(keys, 1)),
             (flat[..., :-1], flat[..., 1:]))
    for a, b in pairs:
        assert abs(float(torch.corrcoef(torch.stack((a.flatten(), b.flatten())))[0, 1])) < 0.01
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    race = draws.reshape(-1, 64)[:20000, :4]
    picks = choose(probs.log()[None].expand(len(race), -1),
                   SamplerSettings(temperature=1.0, top_k=0, top_p=1.0), race)
    freq = torch.bincount(picks, minlength=4).float() / len(picks)
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


class _HostDraws(TorchDispatchMode):
    """Counts random draws (the host generator path made one per row per frame)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ in ("exponential_", "uniform_", "multinomial",
                                            "normal_", "random_", "bernoulli_"):
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def synth(tiny_model_dir: Path, piper_sentences: list[dict[str, Any]]) -> Synthesizer:
    source = resolve_source(tiny_model_dir, reference=Path(piper_sentences[0]["path"]),
                            x_vector_only=True)
    return Synthesizer.load(source, device="cpu", dtype="float32")


def _expected(noise: FrameNoise, seed: int, frames: int) -> list[torch.Tensor]:
    """The noise of every choice of `frames` frames, in the loops' order: codebook 0
    of frame f, then codebooks 1..15 of frame f."""
    keys = row_keys([seed], CPU)
    out = []
    for f in range(frames):
        whole = noise.draw(keys, f)[0]
        out.append(whole[0])
        out.extend(whole[1:])
    return out


@pytest.mark.parametrize("static", [False, True])
def test_generation_uses_the_counter_noise_and_draws_nothing_on_the_host(
        synth: Synthesizer, static: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = DecodeSettings()
    prefill = build_prefill(synth.model, synth.processor,
                            ["A quiet evening by the sea.", "The second row speaks too."],
                            synth.speaker_vector, None, True)
    draws = _HostDraws()
    with record_choices(monkeypatch) as log, draws:
        codes = synth.fast.generate(prefill, [8, 8], settings, seeds=[21, 40], static=static)
    assert draws.count == 0
    frames = min(len(c) for c in codes)
    assert frames >= 3
    width = log.calls[0][2].shape[1]
    noise = FrameNoise(16, width, CPU)
    for row, seed in enumerate((21, 40)):
        expected = _expected(noise, seed, frames)
        for i, want in enumerate(expected):
            got = log.calls[i][2]
            assert got is not None and torch.equal(got[row, :width], want), (row, i)


def test_the_batcher_gives_a_chunk_the_noise_of_its_seed_wherever_it_joins(
        synth: Synthesizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.synth.batcher as batcher_module

    done = threading.Semaphore(0)
    errors: list[BaseException] = []

    def finished(_result: Any, exc: BaseException | None) -> None:
        if exc is not None:
            errors.append(exc)
        done.release()

    with record_choices(monkeypatch) as log:
        monkeypatch.setattr(batcher_module, "choose", log)
        batcher = ContinuousBatcher(synth, rows=2)
        try:
            # a short one-chunk request and a two-chunk one: the second's chunk 1
            # (seed 30 + 1) joins the row freed mid-way, beside a row already running
            for rid, text, seed, cap in (
                    ("short", "Short.", 5, 4),
                    ("long", "The first sentence of two is here. And the second one.", 30, 9)):
                batcher.submit(BatchRequest(
                    rid=rid, text=text, out=str(tmp_path / f"{rid}.wav"), fmt="wav",
                    options=SpeakOptions(seed=seed, max_frames=cap, chunk_chars=40,
                                         loudness_lufs=None),
                    emitter=Emitter(None), done=finished))
            for _ in range(2):
                assert done.acquire(timeout=240)
        finally:
            batcher.close()
    assert not errors
    assert batcher.refills >= 1
    seen = [call[2] for call in log.calls if call[2] is not None]
    width = seen[0].shape[1]
    noise = FrameNoise(16, width, CPU)
    for seed in (5, 30, 31):  # every chunk: request seed + chunk index
        want = _expected(noise, seed, 3)
        # the choices of that chunk's row, in order, among every row of every call
        at = 0
        for got in seen:
            if at < len(want) and any(torch.equal(r[:width], want[at]) for r in got):
                at += 1
        assert at == len(want), (seed, at)
