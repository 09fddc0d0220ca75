"""Our decoding loop against the official generation (tiny model, CPU).

Greedy decoding must give exactly the official codes, so speed never changes
what is said; sampling must draw from exactly the official distribution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model.loading import load_model
from engine.synth.decoding import DecodeSettings, FastTalker
from engine.synth.prompt import _text_ids, build_prefill
from engine.synth.sampling import SamplerSettings, choose, probabilities
from tests.helpers.parity import assert_same_codes, record_choices

# numeric parity: our decoding loop against the official generate, static against eager.
# packaging/run_tests.sh runs these again under other CPU kernel dispatches.
pytestmark = pytest.mark.parity

GREEDY = DecodeSettings(talker=SamplerSettings(do_sample=False),
                        predictor=SamplerSettings(do_sample=False))
TEXTS = ["Hello world, this is a test.",
         "She sells sea shells by the sea shore, and the shells she sells are surely shells."]
FRAMES = 30


@pytest.fixture(scope="module")
def official(tiny_model_dir: Path) -> Any:
    return load_model(tiny_model_dir, device="cpu")


@pytest.fixture(scope="module")
def fast(official: Any) -> FastTalker:
    return FastTalker(official.model)


@pytest.fixture(scope="module")
def speaker(official: Any) -> torch.Tensor:
    hidden = official.model.config.talker_config.hidden_size
    return torch.randn(hidden, generator=torch.Generator().manual_seed(7))


def _official_codes(official: Any, texts: list[str], speaker: torch.Tensor,
                    non_streaming: bool, frames: int) -> list[torch.Tensor]:
    model = official.model
    ids = [_text_ids(official.processor, t, model.device) for t in texts]
    prompt = {"ref_code": [None] * len(texts), "ref_spk_embedding": [speaker] * len(texts),
              "x_vector_only_mode": [True] * len(texts), "icl_mode": [False] * len(texts)}
    # the official loop makes max_new_tokens - 1 frames (the last token is never fed back)
    codes, _ = model.generate(input_ids=ids, languages=["auto"] * len(texts),
                              voice_clone_prompt=prompt, non_streaming_mode=non_streaming,
                              do_sample=False, subtalker_dosample=False,
                              max_new_tokens=frames + 1)
    return list(codes)


@pytest.mark.parametrize("non_streaming", [True, False])
def test_greedy_codes_equal_the_official_generate(official: Any, fast: FastTalker,
                                                  speaker: torch.Tensor,
                                                  non_streaming: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for text in TEXTS:
        expected = _official_codes(official, [text], speaker, non_streaming, FRAMES)[0]
        prefill = build_prefill(official.model, official.processor, [text], speaker, None,
                                non_streaming)
        with record_choices(monkeypatch) as log:
            ours = fast.generate(prefill, [FRAMES], GREEDY)[0]
        assert len(expected) >= 5  # a real run, not an immediate end-of-speech
        assert_same_codes(ours, expected, log, fast.eos)


def test_greedy_batch_with_left_padding_equals_the_official_batch(
        official: Any, fast: FastTalker, speaker: torch.Tensor,
        monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _official_codes(official, TEXTS, speaker, True, FRAMES)
    prefill = build_prefill(official.model, official.processor, TEXTS, speaker, None, True)
    assert len(set(prefill.lengths)) == 2  # rows really are padded
    with record_choices(monkeypatch) as log:
        ours = fast.generate(prefill, [FRAMES, FRAMES], GREEDY)
    for row, (a, b) in enumerate(zip(ours, expected, strict=True)):
        assert_same_codes(a, b, log, fast.eos, row=row)


def test_each_row_stops_at_its_own_cap(official: Any, fast: FastTalker,
                                       speaker: torch.Tensor) -> None:
    prefill = build_prefill(official.model, official.processor, TEXTS, speaker, None, True)
    full = fast.generate(prefill, [FRAMES, FRAMES], GREEDY)
    capped = fast.generate(prefill, [7, FRAMES], GREEDY)
    assert len(capped[0]) == min(7, len(full[0]))
    assert torch.equal(capped[0], full[0][:7])
    assert torch.equal(capped[1], full[1])


def test_sampled_rows_do_not_depend_on_their_batch(official: Any, fast: FastTalker,
                                                   speaker: torch.Tensor,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sampled = DecodeSettings()
    both = build_prefill(official.model, official.processor, TEXTS, speaker, None, True)
    alone = build_prefill(official.model, official.processor, TEXTS[1:], speaker, None, True)
    with record_choices(monkeypatch) as together:
        fast.generate(both, [20, 20], sampled, seeds=[11, 12])
    single = fast.generate(alone, [20], sampled, seeds=[12])
    again = fast.generate(alone, [20], sampled, seeds=[12])
    other = fast.generate(alone, [20], sampled, seeds=[13])
    # the same computation again: exact
    assert torch.equal(single[0], again[0])
    assert not torch.equal(single[0], other[0])
    # Alone against row 1 of the padded batch: padding changes float rounding (a
    # sampled code may flip on a near-tie), so the row alone is teacher-forced on
    # the batch row's codes and each choice compared: the same noise (the row's
    # own stream), the same distribution to rounding.
    with record_choices(monkeypatch, forced=[c[1:] for c in together.own]) as alone_log:
        fast.generate(alone, [20], sampled, seeds=[12])
    n = len(alone_log.calls)
    assert n > 16 * 5
    for i in range(n):
        assert torch.equal(alone_log.calls[i][2][0], together.calls[i][2][1]), i
        torch.testing.assert_close(alone_log.compared(i)[0], together.compared(i)[1],
                                   rtol=1e-4, atol=1e-5, msg=f"choice {i}")
        if int(alone_log.own[i][0]) != int(together.own[i][1]):
            assert together.near_tie(i, 1, int(alone_log.own[i][0]),
                                     int(together.own[i][1]), 1e-4), i


def test_cancel_stops_within_a_frame(official: Any, fast: FastTalker,
                                     speaker: torch.Tensor) -> None:
    prefill = build_prefill(official.model, official.processor, TEXTS[:1], speaker, None, True)
    made: list[int] = []
    out = fast.generate(prefill, [FRAMES], GREEDY, on_frame=made.append,
                        should_stop=lambda: len(made) >= 3)
    assert len(out[0]) == 3


@pytest.mark.parametrize("settings", [SamplerSettings(temperature=0.7, top_k=5, top_p=1.0),
                                      SamplerSettings(temperature=1.3, top_k=0, top_p=0.8),
                                      SamplerSettings(temperature=0.9, top_k=50, top_p=0.9)])
def test_sampling_distribution_equals_hugging_face_warpers(settings: SamplerSettings) -> None:
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = torch.randn(3, 300, generator=torch.Generator().manual_seed(0)) * 3
    scores[:, 250:] = float("-inf")  # suppressed ids, as in the talker
    hf = scores.clone()
    hf = TemperatureLogitsWarper(settings.temperature)(None, hf)
    if settings.top_k:
        hf = TopKLogitsWarper(settings.top_k)(None, hf)
    if settings.top_p < 1:
        hf = TopPLogitsWarper(settings.top_p)(None, hf)
    torch.testing.assert_close(probabilities(scores, settings), hf.softmax(-1))


def test_exponential_race_samples_with_the_right_frequencies() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    scores = probs.log()[None].expand(20000, -1)
    settings = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0)
    noise = torch.empty(20000, 4).exponential_(generator=torch.Generator().manual_seed(3))
    picks = choose(scores, settings, noise)
    freq = torch.bincount(picks, minlength=4).float() / len(picks)
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


@pytest.mark.parametrize("sampled", [False, True])
def test_static_shape_path_equals_the_eager_loop(official: Any, fast: FastTalker,
                                                 speaker: torch.Tensor, sampled: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA-graph path runs this same static frame (captured); on the CPU it
    # runs uncaptured, which checks its masks, buffers and random-stream use.
    # The two paths attend over differently sized, masked caches, so their
    # scores agree to float32 rounding, which depends on the CPU's kernels: a
    # sampled code can flip on an ulp (seen on AVX-512). So the static path is
    # teacher-forced on the eager path's codes and compared step by step.
    settings = DecodeSettings() if sampled else GREEDY
    prefill = build_prefill(official.model, official.processor, TEXTS, speaker, None, False)
    with record_choices(monkeypatch) as eager:
        eager_codes = fast.generate(prefill, [9, 25], settings, seeds=[4, 5], static=False)
    with record_choices(monkeypatch, forced=eager.own) as static:
        codes = fast.generate(prefill, [9, 25], settings, seeds=[4, 5], static=True)
    assert [len(c) for c in codes] == [len(c) for c in eager_codes]
    # the static loop also picks the next token after a row's last frame (unused)
    n = len(eager.own)
    assert n > 16 * 9 and len(static.own) in (n, n + 1)
    flips = 0
    for i in range(n):
        # the same random stream use: noise is copied, never recomputed
        if sampled:
            assert torch.equal(eager.calls[i][2], static.calls[i][2]), i
        # same distribution (sampled) or scores (greedy) to float32 rounding
        torch.testing.assert_close(static.compared(i), eager.compared(i), rtol=1e-4,
                                   atol=1e-5, msg=f"choice {i}")
        # the static path's own pick differs only on a near-tie of what the argmax compares
        for row in (static.own[i] != eager.own[i]).nonzero().flatten().tolist():
            a, b = int(eager.own[i][row]), int(static.own[i][row])
            assert eager.near_tie(i, row, a, b, 1e-4), (i, row)
            flips += 1
    assert flips <= 2


def test_greedy_codes_equal_the_official_generate_in_bfloat16(
        tiny_model_dir: Path, speaker: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 is what GPUs (and bf16-capable CPUs) run: the unfused RMSNorm path
    official = load_model(tiny_model_dir, device="cpu", dtype=torch.bfloat16)
    fast = FastTalker(official.model)
    expected = _official_codes(official, TEXTS[:1], speaker, True, FRAMES)[0]
    prefill = build_prefill(official.model, official.processor, TEXTS[:1], speaker, None, True)
    assert prefill.embeds.dtype == torch.bfloat16
    with record_choices(monkeypatch) as log:
        ours = fast.generate(prefill, [FRAMES], GREEDY)[0]
    # bf16 sums round at about 4e-3: a near-tie is judged at that scale
    assert_same_codes(ours, expected, log, fast.eos, tie=2e-2)


# -- in-context cloning (reference clip + its transcript) -------------------------------------




@pytest.fixture(scope="module")
def reference_clip(official: Any, piper_sentences: list[dict[str, Any]]) -> dict[str, Any]:
    from engine.synth.voice import reference_audio, reference_codes

    entry = piper_sentences[0]
    audio = reference_audio(Path(entry["path"]))
    return {"audio": audio, "text": entry["text"],
            "codes": reference_codes(official.model, audio),
            "xvec": official.model.extract_speaker_embedding(audio, 24000)}


@pytest.mark.parametrize("non_streaming", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_in_context_greedy_codes_equal_the_official_voice_clone(
        official: Any, fast: FastTalker, reference_clip: dict[str, Any], non_streaming: bool,
        text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.synth.prompt import IclPrompt, ref_text_ids

    model = official.model
    ref = reference_clip
    assert ref["codes"].shape[1] == 16 and len(ref["codes"]) > 10
    # the official call, given the prompt create_voice_clone_prompt would build
    ref_ids = official._tokenize_texts([official._build_ref_text(ref["text"])])
    prompt = {"ref_code": [ref["codes"]], "ref_spk_embedding": [ref["xvec"]],
              "x_vector_only_mode": [False], "icl_mode": [True]}
    ids = [_text_ids(official.processor, text, model.device)]
    expected, _ = model.generate(input_ids=ids, ref_ids=ref_ids, voice_clone_prompt=prompt,
                                 languages=["auto"], non_streaming_mode=non_streaming,
                                 do_sample=False, subtalker_dosample=False,
                                 max_new_tokens=FRAMES + 1)
    icl = IclPrompt(ref_text_ids(official.processor, ref["text"], model.device), ref["codes"])
    prefill = build_prefill(model, official.processor, [text], ref["xvec"], None, non_streaming,
                            icl=icl)
    # streaming text of a short sentence fits under the reference frames: nothing trails
    assert prefill.embeds.shape[1] > len(ref["codes"])
    with record_choices(monkeypatch) as log:
        ours = fast.generate(prefill, [FRAMES], GREEDY)[0]
    assert len(expected[0]) >= 5
    assert_same_codes(ours, expected[0], log, fast.eos)


def test_in_context_batch_and_speech_equal_the_official_voice_clone(
        tiny_model_dir: Path, official: Any, reference_clip: dict[str, Any],
        piper_sentences: list[dict[str, Any]]) -> None:
    """End to end through the Synthesizer: the prompt from the clip, our loop, and the
    decode with the reference in front, against `generate_voice_clone` itself in the
    whole-text layout every voice speaks with."""
    import numpy as np

    from engine.config.speak import SpeakOptions
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source
    from engine.text import split_text

    clip = Path(piper_sentences[0]["path"])
    source = resolve_source(tiny_model_dir, reference=clip)
    # the piper clip has a same-named .txt: its transcript is found, in-context mode
    assert source.reference_text == reference_clip["text"]
    assert source.to_dict()["mode"] == "in_context"
    synth = Synthesizer.load(source, device="cpu", dtype="float32")
    options = SpeakOptions(do_sample=False, subtalker_do_sample=False, max_frames=FRAMES,
                           batch_size=2)
    from engine.core.events import Emitter

    chunks = split_text(" ".join(TEXTS), 60, max_frames=FRAMES)
    assert len(chunks) == 2
    codes, _ = synth.generate_codes(chunks, [0, 1], options, Emitter(None), None)
    wavs = synth.decode_audio(codes)
    expected, sr = official.generate_voice_clone(
        [c.text for c in chunks], ref_audio=(reference_clip["audio"], 24000),
        ref_text=reference_clip["text"], do_sample=False, subtalker_dosample=False,
        non_streaming_mode=True, max_new_tokens=FRAMES + 1)
    assert sr == 24000
    for ours, theirs, c in zip(wavs, expected, codes, strict=True):
        assert len(c) >= 5
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_instruction_prompt_equals_the_official_layout(official: Any, fast: FastTalker,
                                                       speaker: torch.Tensor,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.synth.prompt import instruct_ids

    model = official.model
    text = TEXTS[0]
    ins = instruct_ids(official.processor, "Speak slowly and warmly.", model.device)
    expected_ids = official._tokenize_texts([official._build_instruct_text(
        "Speak slowly and warmly.")])[0]
    assert torch.equal(ins, expected_ids)
    prompt = {"ref_code": [None], "ref_spk_embedding": [speaker],
              "x_vector_only_mode": [True], "icl_mode": [False]}
    expected, _ = model.generate(input_ids=[_text_ids(official.processor, text, model.device)],
                                 instruct_ids=[ins], voice_clone_prompt=prompt,
                                 languages=["auto"], non_streaming_mode=True, do_sample=False,
                                 subtalker_dosample=False, max_new_tokens=FRAMES + 1)
    prefill = build_prefill(model, official.processor, [text], speaker, None, True, instruct=ins)
    plain = build_prefill(model, official.processor, [text], speaker, None, True)
    assert prefill.embeds.shape[1] == plain.embeds.shape[1] + ins.shape[1]
    with record_choices(monkeypatch) as log:
        ours = fast.generate(prefill, [FRAMES], GREEDY)[0]
    assert_same_codes(ours, expected[0], log, fast.eos)


def test_packed_and_fused_projections_are_options_that_run_both_loops(
        official: Any, fast: FastTalker, speaker: torch.Tensor,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core.errors import InputError

    settings = DecodeSettings(talker=SamplerSettings(do_sample=False),
                              predictor=SamplerSettings(do_sample=False), stop_at_eos=False)
    prefill = build_prefill(official.model, official.processor, TEXTS, speaker, None, True)
    with record_choices(monkeypatch) as log:
        exact = fast.generate(prefill, [FRAMES, FRAMES], settings)
    fused = FastTalker(official.model, fuse=True).generate(prefill, [FRAMES, FRAMES], settings)
    # the same math in fewer (wider) matmuls: equal up to a rounding near-tie
    for row, (a, b) in enumerate(zip(fused, exact, strict=True)):
        assert_same_codes(a, b, log, fast.eos, row=row)
    for mode in ("int8", "fp16"):
        packed = FastTalker(official.model, quantize=mode, fuse=True)
        with record_choices(monkeypatch) as log8:
            eager = packed.generate(prefill, [FRAMES, FRAMES], settings, static=False)
        static = packed.generate(prefill, [FRAMES, FRAMES], settings, static=True)
        for row, (a, b) in enumerate(zip(eager, static, strict=True)):
            assert a.shape == (FRAMES, 16)
            # static shapes attend over a larger masked cache: other rounding
            assert_same_codes(b, a, log8, packed.eos, row=row)
            assert int(a.max()) < 2048  # real codec codes: the decoder can play them
    # the model itself is untouched: the same loop again gives the same codes
    # (same kernels, same order: exact)
    assert torch.equal(fast.generate(prefill, [FRAMES, FRAMES], settings)[0], exact[0])
    with pytest.raises(InputError, match="Unknown quantization"):
        FastTalker(official.model, quantize="int4")
