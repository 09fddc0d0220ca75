"""Streaming: incremental codec decoding, speech that starts before the text is
generated, a file that grows, raw audio on a pipe, the sound device (tiny model, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.config.speak import SpeakOptions
from engine.core.errors import SynthesisError
from engine.core.events import Event
from engine.model.codec_sizes import REAL_DECODER_CONFIG, build_decoder
from engine.synth.stream import StreamDecoder
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source

# numeric parity (streamed decoding against one full decode): the tests marked
# `parity` run again under other CPU kernel dispatches (packaging/run_tests.sh).
PARITY = pytest.mark.parity

TEXT = ("The kettle started to whistle. She folded the laundry while listening to jazz. "
        "Our train was delayed because of a fallen tree.")


@pytest.fixture(scope="module")
def reference(piper_sentences: list[dict[str, Any]]) -> Path:
    return Path(piper_sentences[0]["path"])


@pytest.fixture(scope="module")
def synth(tiny_model_dir: Path, reference: Path) -> Synthesizer:
    # x-vector mode keeps these fast; in-context streaming is tested on its own below
    return Synthesizer.load(resolve_source(tiny_model_dir, reference=reference,
                                           x_vector_only=True), device="cpu", dtype="float32")


def _random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def _stream(dec: StreamDecoder, codes: torch.Tensor, step: int) -> tuple[np.ndarray, list[int]]:
    parts, sizes = [], []
    for start in range(0, len(codes), step):
        dec.push(codes[start:start + step])
        while (block := dec.pull()).size:
            parts.append(block)
            sizes.append(block.size)
    parts.append(dec.finish())
    return np.concatenate(parts), sizes


@PARITY
@pytest.mark.parametrize("step", [1, 5])
def test_streamed_audio_equals_the_full_decode_of_the_same_codes(synth: Synthesizer,
                                                                  step: int) -> None:
    # 160 frames: past the 72-frame window, so keys and values really slide out
    codes = _random_codes(160, 1)
    full = synth.decode_audio([codes])[0]
    decoder = synth.model.speech_tokenizer.model.decoder
    dec = StreamDecoder(decoder)
    streamed, sizes = _stream(dec, codes, step)
    assert sizes[0] == 4 * 1920  # the first audio after four frames
    assert len(sizes) > 4 and max(sizes) > sizes[0]
    assert streamed.shape == full.shape
    # float rounding only: convolutions over other lengths may sum in another order
    np.testing.assert_allclose(streamed, full, atol=1e-5)
    assert dec.frames_decoded == 160  # every frame through the decoder once
    # the check can fail: a decoder that forgets its state between pieces is wrong
    forgetful = StreamDecoder(decoder)
    parts = []
    for start in range(0, 160, 40):
        forgetful.state.reset()
        forgetful.push(codes[start:start + 40])
        parts.append(forgetful.finish())
    assert np.abs(np.concatenate(parts) - full).max() > 1e-3


@PARITY
def test_streamed_in_context_audio_leaves_out_the_reference(synth: Synthesizer) -> None:
    ref, codes = _random_codes(40, 2), _random_codes(90, 3)
    decoder = synth.model.speech_tokenizer.model.decoder
    dec = StreamDecoder(decoder, prefix=ref)
    streamed, sizes = _stream(dec, codes, 3)
    whole = synth.decode_audio([torch.cat((ref, codes))])[0]
    np.testing.assert_allclose(streamed, whole[40 * 1920:], atol=1e-5)
    assert sizes[0] == 4 * 1920 and dec.frames_decoded == 130
    # the reference decoded once, each chunk continuing from a copy of that state
    primed = StreamDecoder.prime(decoder, ref)
    for _ in range(2):  # the copy is independent: a second chunk starts the same
        again = StreamDecoder(decoder, primed=primed)
        out, _ = _stream(again, codes, 3)
        np.testing.assert_allclose(out, whole[40 * 1920:], atol=1e-5)
        assert again.frames_decoded == 90


@PARITY
def test_real_size_codec_streams_each_frame_once_and_equals_the_full_decode() -> None:
    """The published decoder (8 layers, window 72, 1536-wide convolutions; random
    weights): a prefix and 22 frames, pushed one at a time in small pieces."""
    decoder = build_decoder(REAL_DECODER_CONFIG, seed=5)
    ref, codes = _random_codes(6, 6), _random_codes(22, 7)
    with torch.inference_mode():
        full = decoder(torch.cat((ref, codes)).T[None])[0, 0].numpy()
    assert 0.05 < np.abs(full).max() < 1.0  # audible, not clipped: the comparison means something
    dec = StreamDecoder(decoder, prefix=ref, first_piece=2, max_piece=4)
    streamed, sizes = _stream(dec, codes, 1)
    assert sizes[:3] == [2 * 1920, 4 * 1920, 4 * 1920]
    # float rounding only (AVX-512 here; CI may sum in another order)
    np.testing.assert_allclose(streamed, full[6 * 1920:], atol=1e-5)
    spoken = len(codes)
    assert dec.frames_decoded - len(ref) <= 1.1 * spoken
    assert dec.state.calls == len(sizes) + (1 if streamed.size > sum(sizes) else 0)


class _Sink:
    def __init__(self, events: list[Event]) -> None:
        self.blocks: list[np.ndarray] = []
        self.events = events
        self.chunks_done_at_first: int | None = None

    def write(self, audio: np.ndarray) -> None:
        if self.chunks_done_at_first is None:
            self.chunks_done_at_first = sum(
                1 for e in self.events if e.kind == "progress" and e.data["stage"] == "chunks")
        self.blocks.append(audio)


@PARITY
def test_speech_reaches_the_sink_before_its_first_chunk_is_finished(synth: Synthesizer) -> None:
    events: list[Event] = []
    sink = _Sink(events)
    options = SpeakOptions(seed=4, chunk_chars=40, max_frames=30, batch_size=2)
    speech = synth.speak_stream(TEXT, sink, options, on_event=events.append)
    # audio came out while the first batch was still being generated
    assert sink.chunks_done_at_first == 0
    assert speech.first_audio_s is not None  # its value is bench/bench_synth.py's figure
    assert len(sink.blocks) > len(speech.chunks)
    # the finished render is what speak() makes with the same seed
    plain = synth.speak(TEXT, options)
    assert [len(c) for c in speech.codes] == [len(c) for c in plain.codes]
    for a, b in zip(speech.codes, plain.codes, strict=True):
        assert torch.equal(a, b)
    np.testing.assert_allclose(speech.audio, plain.audio, atol=2e-4)
    # the sink heard every chunk's audio plus the pauses between them
    heard = sum(b.size for b in sink.blocks)
    frames = sum(c["frames"] for c in speech.chunks)
    pauses = sum(round(0.3 * 24000) for _ in speech.chunks[:-1])
    assert heard == frames * 1920 + pauses


def test_out_of_memory_is_one_sentence_streamed_or_not(synth: Synthesizer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def exhausted(*_args: Any, **_kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    # the decoder's step is where the device runs out; what speaks it is under test
    monkeypatch.setattr(synth.fast, "generate", exhausted)
    for speak in (lambda: synth.speak(TEXT, SpeakOptions(seed=1)),
                  lambda: synth.speak_stream(TEXT, _Sink([]), SpeakOptions(seed=1))):
        with pytest.raises(SynthesisError, match="ran out of memory") as caught:
            speak()
        assert "batch size" in (caught.value.hint or "")


def test_stream_to_a_growing_file_then_the_finished_render(synth: Synthesizer,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "grow.wav"
    seen: list[int] = []

    def on_event(event: Event) -> None:
        if event.kind == "artifact" and event.data["role"] == "speech_partial":
            seen.append(sf.info(out).frames)  # readable, with audio in it, mid-way

    result = synth.speak_to_file(TEXT, out, SpeakOptions(seed=1, chunk_chars=40, max_frames=20),
                                 on_event=on_event, stream=True)
    assert seen and seen[0] > 0
    assert result["first_audio_s"] is not None
    final, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and len(final) / sr == pytest.approx(result["duration_s"], abs=1e-3)


@PARITY
def test_in_context_streaming_matches_its_plain_render(tiny_model_dir: Path,
                                                       reference: Path) -> None:
    synth = Synthesizer.load(resolve_source(tiny_model_dir, reference=reference), device="cpu",
                             dtype="float32")
    assert synth.icl is not None
    options = SpeakOptions(seed=2, max_frames=15, loudness_lufs=None)
    sink = _Sink([])
    streamed = synth.speak_stream("A short one.", sink, options)
    plain = synth.speak("A short one.", options)
    assert torch.equal(streamed.codes[0], plain.codes[0])
    np.testing.assert_allclose(streamed.audio, plain.audio, atol=1e-4)


def test_cli_streams_raw_pcm_to_a_pipe(tiny_model_dir: Path, reference: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "speak", str(tiny_model_dir), "Pipe it.",
         "-o", "-", "--reference", str(reference), "--x-vector-only", "--seed", "1",
         "--max-frames", "12", "--dtype", "float32"],
        capture_output=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    pcm = np.frombuffer(proc.stdout, dtype="<i2")
    assert pcm.size > 0 and pcm.size % 1920 == 0 and np.abs(pcm).max() > 0
    assert b"Streamed raw 16-bit" in proc.stderr and b"first audio after" in proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "--json", "speak", str(tiny_model_dir), "x",
         "-o", "-"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "--json" in json.loads(bad.stdout.splitlines()[-1])["message"]


def test_cli_plays_on_the_sound_device(tiny_model_dir: Path, reference: Path) -> None:
    try:
        import sounddevice as sd

        sd.query_devices(kind="output")
    except Exception as exc:  # no PortAudio or no output device on this machine
        pytest.skip(f"no sound output here: {exc}")
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "--json", "speak", str(tiny_model_dir),
         "Play it.", "--play", "--reference", str(reference), "--x-vector-only", "--seed", "1",
         "--max-frames", "10"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["event"] == "result" and result["duration_s"] > 0
    assert result["first_audio_s"] is not None
    # the jitter buffer reports its gaps (a number, however many) and pre-buffer
    assert isinstance(result["playback"]["underruns"], int)
    metrics = [json.loads(line) for line in proc.stdout.splitlines()
               if '"play/underruns"' in line]
    assert metrics and metrics[0]["event"] == "metric"
