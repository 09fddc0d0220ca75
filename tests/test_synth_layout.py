"""The text layout every voice speaks with, and the reference clip's silent tail (tiny model).

Every voice, zero-shot and instant ones included, puts the whole text in the prompt
(the official non-streaming layout): the one-token-per-frame feed hurries speech
(QwenLM/Qwen3-TTS #239). Our talker inputs must be the official generate's, input for
input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.audio.io import read_mono
from engine.audio.vad import speech_regions
from engine.config.speak import SpeakOptions
from engine.core.events import Emitter
from engine.synth.prompt import IclPrompt, _ref_codec_embed, build_prefill, ref_text_ids
from engine.synth.reference import TAIL_S, trailing_silence_s
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import reference_audio, resolve_source
from engine.text import split_text
from tests.helpers.official import official_generate

TEXT = "She sells sea shells by the sea shore."
FRAMES = 12
SR = 24000


@pytest.fixture(scope="module")
def clip(piper_sentences: list[dict[str, Any]]) -> Path:
    return Path(piper_sentences[0]["path"])


@pytest.fixture(scope="module")
def synth(tiny_model_dir: Path, clip: Path) -> Synthesizer:
    # the piper clip has its transcript beside it: in-context cloning
    return Synthesizer.load(resolve_source(tiny_model_dir, reference=clip), device="cpu",
                            dtype="float32")


@pytest.mark.parity
@pytest.mark.parametrize("in_context", [True, False])
def test_non_streaming_talker_inputs_equal_the_official_inputs(synth: Synthesizer,
                                                               in_context: bool) -> None:
    model, icl = synth.model, synth.icl
    assert icl is not None
    ref_text = synth.source.reference_text
    assert ref_text
    theirs = official_generate(synth.wrapper, TEXT, synth.speaker_vector, FRAMES,
                               reference=(ref_text, icl.ref_codes) if in_context else None,
                               non_streaming=True)
    prompt = IclPrompt(ref_text_ids(synth.processor, ref_text, synth.fast.device),
                       icl.ref_codes) if in_context else None
    ours = build_prefill(model, synth.processor, [TEXT], synth.speaker_vector, None, True,
                         icl=prompt)
    n = ours.embeds.shape[1]
    fed = theirs["inputs"]
    assert torch.equal(ours.embeds[0], fed[:n])
    # each later input: the frame just made (its 16 codebooks' embeddings summed) plus
    # our text channel, which in this layout is tts_pad throughout
    steps = fed[n:]
    assert len(steps) >= FRAMES - 2
    for k, step in enumerate(steps):
        text = ours.trailing[0, k] if k < ours.trailing.shape[1] else ours.tts_pad[0, 0]
        assert torch.equal(text, ours.tts_pad[0, 0])
        frame = _ref_codec_embed(model, theirs["codes"][k:k + 1])[0, 0]
        assert torch.equal(step, frame + text), f"input {n + k} (frame {k}) differs"


@pytest.mark.parity
def test_every_voice_speaks_the_whole_text_layout_by_default(synth: Synthesizer) -> None:
    """A zero-shot (in-context) voice with default options gives the official codes of the
    non-streaming layout, greedy; the other layout stays an option."""
    assert synth.source.kind == "zero_shot" and synth.icl is not None
    greedy = SpeakOptions(do_sample=False, subtalker_do_sample=False, max_frames=FRAMES)
    chunk = split_text(TEXT, 200, max_frames=FRAMES)
    ours, _ = synth.generate_codes(chunk, [0], greedy, Emitter(None), None)
    ref = (synth.source.reference_text or "", synth.icl.ref_codes)
    whole = official_generate(synth.wrapper, TEXT, synth.speaker_vector, FRAMES,
                              reference=ref, non_streaming=True)["codes"]
    streamed = official_generate(synth.wrapper, TEXT, synth.speaker_vector, FRAMES,
                                 reference=ref, non_streaming=False)["codes"]
    assert len(ours[0]) >= 5
    assert torch.equal(ours[0], whole[:len(ours[0])])
    assert not torch.equal(ours[0], streamed[:len(ours[0])])
    other, _ = synth.generate_codes(chunk, [0], greedy.replace(non_streaming=False),
                                    Emitter(None), None)
    assert torch.equal(other[0], streamed[:len(other[0])])


def _speech_to_the_end(clip: Path) -> np.ndarray:
    audio = read_mono(clip, SR)
    end = speech_regions(audio, SR)[-1][1]
    return audio[:end]


@pytest.mark.parametrize("silence_s", [0.0, 0.2, 0.8])
def test_a_reference_clip_ends_with_half_a_second_of_silence(clip: Path, tmp_path: Path,
                                                             silence_s: float) -> None:
    speech = _speech_to_the_end(clip)
    given = np.concatenate((speech, np.zeros(int(silence_s * SR), np.float32)))
    path = tmp_path / "ref.wav"
    sf.write(path, given, SR, subtype="FLOAT")
    assert trailing_silence_s(given, SR) == pytest.approx(silence_s, abs=0.011)
    ready = reference_audio(path)
    # silence it had counts: only what is missing is added, and the clip itself is kept
    assert np.array_equal(ready[:len(given)], given)
    assert trailing_silence_s(ready, SR) == pytest.approx(max(TAIL_S, silence_s), abs=0.011)
    assert not np.any(ready[len(given):])
