"""CPU speed options, honestly: int8 and fp16 weights whose rows never depend on their
batch, and the teacher-forced agreement measure (per-choice logits against fp32) the bench
reports (tiny model)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config.speak import SpeakOptions
from engine.synth.agreement import compare_logits, teacher_forced_logits
from engine.synth.prompt import build_prefill
from engine.synth.quant import Fp16Linear, Int8Linear
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source


def test_an_int8_row_is_the_same_whatever_shares_its_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 128, generator=gen) * 0.05
    lin = Int8Linear(weight)
    row = torch.randn(1, 128, generator=gen)
    outlier = torch.randn(1, 128, generator=gen)
    outlier[0, 7] = 400.0  # one channel far outside the others
    alone = lin(row)
    batched = lin(torch.cat((row, outlier)))[:1]
    assert torch.equal(alone, batched)  # same kernel, same row: bit for bit
    # the check can fail: fbgemm's per-batch activation scale coarsens the row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared = torch.ops.quantized.linear_dynamic(torch.cat((row, outlier)), lin.packed,
                                                    True)[:1]
    exact = row @ weight.T
    assert (shared - exact).norm() > 3 * (alone - exact).norm()


@pytest.mark.parity
def test_fp16_weights_round_once_and_never_depend_on_the_batch() -> None:
    """fp16 weights: the projection is x (W rounded to fp16)^T in fp32, to fp32 rounding,
    for a row alone or in a batch with an outlier row (nothing is quantized per call)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 128, generator=gen) * 0.05
    bias = torch.randn(96, generator=gen)
    lin = Fp16Linear(weight, bias)
    row = torch.randn(1, 128, generator=gen)
    outlier = torch.randn(1, 128, generator=gen)
    outlier[0, 7] = 400.0
    rounded = weight.half().double()
    reference = (row.double() @ rounded.T + bias.double()).float()
    alone = lin(row)
    batched = lin(torch.cat((row, outlier)))[:1]
    torch.testing.assert_close(alone, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)
    # the check can fail: the rounding is there, about fp16's 2^-11 relative
    exact = row.double() @ weight.double().T + bias.double()
    assert 1e-6 < float((alone.double() - exact).norm() / exact.norm()) < 1e-3


@pytest.fixture(scope="module")
def voices(tiny_model_dir: Path, piper_sentences: list[dict[str, Any]]) -> tuple[Any, Any]:
    source = resolve_source(tiny_model_dir, reference=Path(piper_sentences[0]["path"]),
                            x_vector_only=True)
    exact = Synthesizer.load(source, device="cpu", dtype="float32")
    quick = Synthesizer(exact.wrapper, source, None, quantize="int8", fuse=True)
    quick.use_source(source)
    return exact, quick


def test_teacher_forced_logits_reproduce_the_greedy_codes_and_measure_int8(
        voices: tuple[Any, Any]) -> None:
    exact, quick = voices
    options = SpeakOptions(do_sample=False, subtalker_do_sample=False, repetition_penalty=1.0)
    settings = exact.decode_settings(options)
    prefill = build_prefill(exact.model, exact.processor, ["A quiet evening by the sea."],
                            exact.speaker_vector, None, True)
    codes = exact.fast.generate(prefill, [12], settings)[0]
    assert len(codes) >= 4
    ref = teacher_forced_logits(exact.fast, prefill, codes)
    # fed its own greedy codes, fp32 picks every one of them again (the loop is the
    # generation loop, choice for choice)
    assert torch.equal(ref.argmax(-1), codes)
    same = compare_logits(ref, teacher_forced_logits(exact.fast, prefill, codes))
    assert same.choices == len(codes) * 16
    assert same.rel_error == 0 and same.top1 == 1 and same.kl == 0
    fast = compare_logits(ref, teacher_forced_logits(quick.fast, prefill, codes))
    # int8 rounds: measurably different, yet close (the bench gives the 0.6B figures)
    assert 0 < fast.rel_error < 0.2 and fast.kl > 0
    assert fast.top1 > 0.5


@pytest.mark.parity
def test_fp16_weights_agree_with_fp32_far_closer_than_int8(voices: tuple[Any, Any]) -> None:
    """Teacher-forced on fp32's greedy codes: fp16 weights move the logits by rounding only
    (an order of magnitude below int8's error) and pick fp32's code almost every time."""
    exact, quick = voices
    packed = Synthesizer(exact.wrapper, exact.source, None, quantize="fp16", fuse=True)
    packed.use_source(exact.source)
    options = SpeakOptions(do_sample=False, subtalker_do_sample=False, repetition_penalty=1.0)
    prefill = build_prefill(exact.model, exact.processor, ["A quiet evening by the sea."],
                            exact.speaker_vector, None, True)
    codes = exact.fast.generate(prefill, [12], exact.decode_settings(options))[0]
    ref = teacher_forced_logits(exact.fast, prefill, codes)
    half = compare_logits(ref, teacher_forced_logits(packed.fast, prefill, codes))
    int8 = compare_logits(ref, teacher_forced_logits(quick.fast, prefill, codes))
    assert 0 < half.rel_error < int8.rel_error / 10
    assert half.top1 >= 0.95 and half.kl < int8.kl
