"""Speech speed: our decoding loop against the official `generate_custom_voice`.

    python bench/bench_synth.py [--models tiny,0.6b] [--frames 24] [--layers 28]
                                [--int8] [--device cuda] [--threads 2] [--rounds 3]

For each model (a custom-voice folder exported from random weights: the tiny
test model, and the real 0.6B configuration) it prints the real-time factor
(seconds of audio per second of compute; higher is faster) of:
- one sentence (batch 1);
- four sentences (the official call batched over a list, ours batched the
  same way);
- a long text of eight sentences: the official call given the whole text,
  as its API takes it, against ours splitting it at sentences and
  generating the chunks as one batch (the same total audio);
the first two end to end (prompt, generation, codec decode) and for
generation alone, by wall time and by this process's CPU time (steadier on
a shared machine).
Both sides sample with the model's default settings and make exactly
`--frames` codec frames per sentence (end-of-speech cannot stop either: the
official call gets an end id that generation never emits, ours bans it), so
the work is identical. Both share one loaded model, in one process.

Then, per model: time to first audio of a streamed sentence
(`Synthesizer.speak_stream`), the warm worker's throughput under 8
concurrent requests (continuous batching, 8 rows) against the same worker
one row at a time, and, with --int8 (CPU), the CPU options whose output does
not depend on the batch (int8 with per-row activation scales, fp16 weights,
each with fused projections; bf16) against fp32: teacher-forced agreement (every choice's
logits on fp32's greedy codes: relative error, top-1, KL; also weight-only int8
rounding, per channel and per group, run in fp32: the best such a kernel could
agree) and speed against
the official fp32 call (--rounds rounds, each the official call then every
option, the median of the per-round ratios, with their range), then one line
per option on the issue's CPU target (one sentence end to end at least 2x
the official call at its defaults, by wall and by CPU time, with top-1
agreement of at least 99 %: met or NOT met; the issue sets it for 2 cores:
--threads 2).
Every option decodes with the same codec (the fp32 model's). On CUDA it
prints whether the frame graph was captured; on the CPU with --compile-frame,
the fixed-shape frame under `torch.compile` (inductor) against itself eager.

First (unless --stream-frames 0), the streaming codec at its published size
(engine/model/codec_sizes.py, random weights): one full decode of
--stream-frames frames against the stateful stream, with and without an
in-context reference of --ref-frames frames (decoded per chunk, or once per
voice and copied: "primed"), with the frames decoded, the calls, the first
audio and the codec's own real-time factor.

The 0.6B model figures use the tiny model's codec unless --real-codec (the
published decoder size, random weights, in place of the tiny one), so without
it their decode share is smaller than the real one; the generation-only
column is the like-for-like figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FRAME_S = 1920 / 24000  # one codec frame is 80 ms of audio
SPEAKER = "bench"
SENTENCES = [
    "The kettle started to whistle just as the phone rang in the hall.",
    "She folded the laundry while listening to an old jazz record.",
    "Our train was delayed because of a fallen tree on the track.",
    "Fresh bread tastes best while it is still warm from the oven.",
    "Could you move the blue chair closer to the window, please?",
    "The river curved gently through a valley of tall pines.",
    "Light from the sun takes about eight minutes to reach the earth.",
    "Please remember to water the plants while I am away.",
]
#: the real 0.6B-Base talker and code predictor (qwen3-tts-facts.md)
TALKER_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "text_hidden_size": 2048, "text_vocab_size": 151936}
PREDICTOR_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                 "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}


def tiny_voice(work: Path) -> Path:
    import numpy as np

    from engine.model.export import export_custom_voice
    from engine.model.tiny import make_tiny_model

    base = make_tiny_model(work / "tiny-base", seed=0)
    hidden = json.loads((base / "config.json").read_text())["talker_config"]["hidden_size"]
    xvec = np.random.default_rng(0).standard_normal(hidden).astype("float32") * 0.05
    return export_custom_voice(base, {}, SPEAKER, xvec, work / "tiny-voice")


def voice_06b(work: Path, layers: int, talker_sizes: dict[str, Any] | None = None,
              name: str = "06b") -> Path:
    """Custom voice with the real 0.6B talker shape (or `talker_sizes` over it, e.g.
    the 1.7B widths) and random weights (std 0.02)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from engine.model.export import export_custom_voice
    from engine.model.official import configuration, modeling
    from engine.model.tiny import make_tiny_model

    tiny = make_tiny_model(work / f"tiny-for-{name}", seed=0)
    base = work / f"base-{name}"
    base.mkdir()
    cfg = json.loads((tiny / "config.json").read_text())
    talker = cfg["talker_config"]
    talker.update(TALKER_06B, num_hidden_layers=layers)
    talker.update(talker_sizes or {})
    # MRoPE sections sum to head_dim / 2, as in the released models
    talker["rope_scaling"] = {"interleaved": True, "mrope_section": [24, 20, 20],
                              "rope_type": "default"}
    talker["code_predictor_config"].update(PREDICTOR_06B)
    for sub in (talker, talker["code_predictor_config"]):
        sub.pop("layer_types", None)  # rebuilt from the layer count
    cfg["speaker_encoder_config"]["enc_dim"] = talker["hidden_size"]
    cfg["tts_model_size"] = "0b6"
    (base / "config.json").write_text(json.dumps(cfg, indent=1))
    for item in tiny.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            target = base / item.name
            if item.is_dir():
                import shutil

                shutil.copytree(item, target)
            else:
                target.write_bytes(item.read_bytes())
    config = configuration().Qwen3TTSConfig.from_pretrained(str(base))
    torch.manual_seed(0)
    talker_module = modeling().Qwen3TTSTalkerForConditionalGeneration(config.talker_config)
    with torch.no_grad():
        for p in talker_module.parameters():
            p.normal_(0.0, 0.02)
    state = {f"talker.{k}": v.to(torch.bfloat16).contiguous()
             for k, v in talker_module.state_dict().items()}
    del talker_module
    save_file(state, str(base / "model.safetensors"))
    del state
    gc.collect()
    xvec = np.random.default_rng(0).standard_normal(talker["hidden_size"]).astype("float32")
    return export_custom_voice(base, {}, SPEAKER, xvec * 0.02, work / f"voice-{name}")


def _clock() -> tuple[float, float]:
    # wall time, and this process's CPU time: on a machine shared with other
    # jobs the CPU time is the steadier measure of the work done (on a GPU the
    # queue is drained first, and CPU time means little)
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


def _official(wrapper: Any, texts: list[str], frames: int, decode: bool) -> tuple[float, float]:
    import torch

    eos_never = wrapper.model.config.talker_config.codec_pad_id  # suppressed: never emitted
    start = _clock()
    if decode:
        wavs, _ = wrapper.generate_custom_voice(texts, speaker=[SPEAKER] * len(texts),
                                                max_new_tokens=frames + 1,
                                                eos_token_id=eos_never)
        assert len(wavs) == len(texts)
    else:
        ids = [wrapper._tokenize_texts([wrapper._build_assistant_text(t)])[0] for t in texts]
        kwargs = wrapper._merge_generate_kwargs(max_new_tokens=frames + 1)
        with torch.no_grad():
            wrapper.model.generate(input_ids=ids, languages=["auto"] * len(texts),
                                   speakers=[SPEAKER] * len(texts), non_streaming_mode=True,
                                   eos_token_id=eos_never, **kwargs)
    return _since(start)


def _ours(synth: Any, texts: list[str], frames: int, decode: bool) -> tuple[float, float]:
    import dataclasses

    from engine.config.speak import SpeakOptions
    from engine.synth.prompt import build_prefill

    settings = dataclasses.replace(synth.decode_settings(SpeakOptions()), stop_at_eos=False)
    start = _clock()
    prefill = build_prefill(synth.model, synth.processor, texts, synth.speaker_vector, None,
                            True)
    codes = synth.fast.generate(prefill, [frames] * len(texts), settings,
                                seeds=list(range(len(texts))))
    assert all(len(c) == frames for c in codes)
    if decode:
        synth.decode_audio(codes)
    return _since(start)


def check_greedy(wrapper: Any, synth: Any, frames: int) -> bool:
    """Ours (with CUDA graphs on a GPU) against the official generate, greedy."""
    import torch

    from engine.config.speak import SpeakOptions
    from engine.synth.prompt import build_prefill

    text = SENTENCES[0]
    ids = [wrapper._tokenize_texts([wrapper._build_assistant_text(text)])[0]]
    with torch.no_grad():
        expected, _ = wrapper.model.generate(
            input_ids=ids, languages=["auto"], speakers=[SPEAKER], non_streaming_mode=True,
            do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1)
    settings = synth.decode_settings(SpeakOptions(do_sample=False, subtalker_do_sample=False))
    prefill = build_prefill(synth.model, synth.processor, [text], synth.speaker_vector, None,
                            True)
    paths = [("default", None)]
    if synth.fast.device.type == "cuda":
        # the CUDA-graph loop attends over the whole static cache with a mask,
        # which may round differently from the official unmasked attention in
        # bf16; the eager loop is the op-for-op twin of the official one
        paths.append(("eager", False))
    same_all = True
    for label, static in paths:
        ours = synth.fast.generate(prefill, [frames], settings, static=static)
        same = ours[0].shape == expected[0].shape and bool(torch.equal(ours[0], expected[0]))
        same_all &= same
        verdict = "identical to" if same else "DIFFERENT from"
        print(f"greedy check, {label} loop ({len(expected[0])} frames): {verdict} the official "
              "codes", flush=True)
    return same_all


def _fp32_reference(synth: Any, frames: int) -> tuple[list[tuple[Any, Any]], Any]:
    """fp32's greedy codes for 2 sentences, with their prefills, and fp32's own
    teacher-forced logits on them: the reference every option is scored against."""
    import dataclasses

    import torch

    from engine.config.speak import SpeakOptions
    from engine.synth.agreement import teacher_forced_logits
    from engine.synth.prompt import build_prefill

    greedy = SpeakOptions(do_sample=False, subtalker_do_sample=False)
    settings = dataclasses.replace(synth.decode_settings(greedy), stop_at_eos=False)
    cases = []
    for text in SENTENCES[:2]:
        prefill = build_prefill(synth.model, synth.processor, [text], synth.speaker_vector,
                                None, True)
        cases.append((prefill, synth.fast.generate(prefill, [frames], settings)[0]))
    return cases, torch.cat([teacher_forced_logits(synth.fast, p, c) for p, c in cases])


def _teacher_forced(reference: tuple[list[tuple[Any, Any]], Any], others: dict[str, Any],
                    frames: int) -> dict[str, Any]:
    """Per-choice logits of each fast option against fp32, all fed fp32's greedy codes."""
    import torch

    from engine.synth.agreement import compare_logits, teacher_forced_logits

    cases, ref = reference
    found = {}
    for label, other in others.items():
        logits = torch.cat([teacher_forced_logits(other.fast, p, c) for p, c in cases])
        agreement = found[label] = compare_logits(ref, logits)
        print(f"teacher-forced {label:<10} vs fp32, 2 sentences x {frames} frames x 16 "
              f"codebooks: {agreement.line()}", flush=True)
    return found


def bench_compiled_frame(name: str, synth: Any, frames: int) -> None:
    """`torch.compile` (inductor) of the fixed-shape frame (`rows.RowBatch.frame`, the
    one CUDA graphs capture) on the CPU, against the same frame eager: compile time,
    ms per frame, and whether the codes are equal."""
    import dataclasses
    import functools

    import torch

    from engine.config.speak import SpeakOptions
    from engine.synth import rows as rows_module
    from engine.synth.prompt import build_prefill

    settings = dataclasses.replace(synth.decode_settings(SpeakOptions()), stop_at_eos=False)

    def generate(n: int) -> tuple[float, Any]:
        prefill = build_prefill(synth.model, synth.processor, SENTENCES[:1],
                                synth.speaker_vector, None, True)
        started = time.perf_counter()
        codes = synth.fast.generate(prefill, [n], settings, seeds=[0], static=True)
        return time.perf_counter() - started, codes[0]

    def per_frame() -> tuple[float, Any]:
        short, _ = generate(4)
        long, codes = generate(frames)
        return (long - short) / (frames - 4) * 1e3, codes

    generate(3)
    eager_ms, eager_codes = per_frame()
    original = rows_module.RowBatch.frame
    compiled: dict[int, Any] = {}

    def frame(self: Any, span: int) -> None:
        fn = compiled.get(id(self))
        if fn is None:
            fn = compiled[id(self)] = torch.compile(functools.partial(original, self))
        fn(span)

    rows_module.RowBatch.frame = frame  # type: ignore[method-assign]
    try:
        first_s, _ = generate(3)
        generate(frames)  # a second span compiles once more (then dynamic)
        generate(frames)
        compiled_ms, compiled_codes = per_frame()
    finally:
        rows_module.RowBatch.frame = original  # type: ignore[method-assign]
    print(f"{name:<5} torch.compile of the frame step (CPU, {torch.get_num_threads()} "
          f"thread(s)): first call {first_s:.1f} s (compiling), eager {eager_ms:.1f} ms per "
          f"frame, compiled {compiled_ms:.1f} ms, x{eager_ms / compiled_ms:.2f}; codes equal: "
          f"{torch.equal(eager_codes, compiled_codes)}", flush=True)


def weight_only_int8_agreement(folder: Path, synth: Any, frames: int,
                               reference: tuple[list[tuple[Any, Any]], Any],
                               groups: tuple[int, ...] = (0, 128, 64, 32)) -> None:
    """What weight-only int8 could reach at best: every talker and code-predictor
    projection (and head) rounded to int8 with one scale per output channel (group 0)
    or per group of input channels, run in fp32 (no kernel's own rounding), then
    teacher-forced against fp32. Speed is not measured: it is the precision bound."""
    import torch

    from engine.model.loading import load_model
    from engine.synth.synthesizer import Synthesizer

    def rounded(w: torch.Tensor, group: int) -> torch.Tensor:
        rows, cols = w.shape
        size = group if group and cols % group == 0 else cols
        g = w.reshape(rows, cols // size, size)
        scale = (g.abs().amax(-1, keepdim=True) / 127.0).clamp_min(1e-12)
        return (torch.round(g / scale).clamp(-127, 127) * scale).reshape(rows, cols)

    for group in groups:  # one model at a time: each is a full fp32 copy
        wrapper = load_model(folder, device="cpu", dtype=torch.float32)
        wrapper.model.speech_tokenizer = synth.model.speech_tokenizer
        with torch.no_grad():
            for name, module in wrapper.model.talker.named_modules():
                if isinstance(module, torch.nn.Linear) and ("layers" in name or "head" in name):
                    module.weight.copy_(rounded(module.weight, group))
        other = Synthesizer(wrapper, synth.source, None)
        other.use_source(synth.source)
        _teacher_forced(reference, {f"w8 g{group}" if group else "w8 channel": other}, frames)
        del other, wrapper
        gc.collect()


def use_real_codec(model: Any, seed: int = 0) -> None:
    """The published codec decoder size (random weights) in place of the loaded one, on
    its device and in its dtype: bf16 where the model was loaded in bf16, as the product
    loads it on a GPU (the official loader gives the codec the model's dtype)."""
    from engine.model.codec_sizes import REAL_DECODER_CONFIG, build_decoder

    tokenizer = model.speech_tokenizer.model
    like = next(tokenizer.decoder.parameters())
    tokenizer.decoder = build_decoder(REAL_DECODER_CONFIG, seed=seed).to(like.device,
                                                                         like.dtype)


def _first_audio(synth: Any, frames: int) -> float:
    from engine.config.speak import SpeakOptions

    class Sink:
        def write(self, audio: Any) -> None:
            pass

    speech = synth.speak_stream(SENTENCES[0], Sink(), SpeakOptions(seed=1, max_frames=frames))
    assert speech.first_audio_s is not None
    return speech.first_audio_s


def _worker_throughput(synth: Any, rows: int, requests: int, frames: int,
                       tmp: Path) -> tuple[float, float]:
    """(audio seconds, wall seconds) for `requests` concurrent one-sentence requests."""
    import threading

    from engine.config.speak import SpeakOptions
    from engine.core.events import Emitter
    from engine.synth.batcher import BatchRequest, ContinuousBatcher

    batcher = ContinuousBatcher(synth, rows=rows)
    # as the worker does at load: on CUDA the frame graphs are captured here, not inside
    # the timed requests
    batcher.prepare()
    done = threading.Semaphore(0)
    audio = [0.0]

    errors: list[BaseException] = []

    def finished(result: Any, exc: Any) -> None:
        if exc is not None:
            errors.append(exc)
        else:
            audio[0] += result["duration_s"]
        done.release()

    start = _clock()
    for i in range(requests):
        batcher.submit(BatchRequest(
            rid=f"r{i}", text=SENTENCES[i % len(SENTENCES)], out=str(tmp / f"w{rows}-{i}.wav"),
            fmt="wav", options=SpeakOptions(seed=i, max_frames=frames, loudness_lufs=None),
            emitter=Emitter(None), done=finished))
    for _ in range(requests):
        if not done.acquire(timeout=600):
            raise SystemExit("the worker stopped answering")
    wall, _cpu = _since(start)
    batcher.close()
    if errors:
        raise SystemExit(f"a worker request failed: {errors[0]!r}")
    return audio[0], wall


def bench_streaming(frames: int, ref_frames: int, device: str) -> list[dict[str, Any]]:
    """The published 12 Hz codec decoder (random weights): one full decode against
    the stateful stream (frames pushed one at a time, pieces 4, 8 ... 48), with and
    without an in-context reference, decode time only (the talker is not run)."""
    import torch

    from engine.model.codec_sizes import REAL_DECODER_CONFIG, build_decoder
    from engine.synth.stream import StreamDecoder

    decoder = build_decoder(REAL_DECODER_CONFIG, seed=0).to(device)
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 2048, (frames, 16), generator=gen)
    ref = torch.randint(0, 2048, (ref_frames, 16), generator=gen)
    with torch.inference_mode():
        decoder(codes[:4].T[None].to(device))  # one-off allocations
        start = _clock()
        decoder(codes.T[None].to(device))
        full_s, full_cpu = _since(start)
    rows = []

    def stream(label: str, dec: StreamDecoder, setup_s: float = 0.0) -> None:
        start = _clock()
        first = None
        for f in range(frames):
            dec.push(codes[f:f + 1])
            if dec.pull().size and first is None:
                first = _since(start)[0]
        dec.finish()
        total, cpu = _since(start)
        row = {"case": label, "frames": frames, "decoded_frames": dec.frames_decoded,
               "calls": dec.state.calls, "stream_s": round(total, 3),
               "full_decode_s": round(full_s, 3), "first_audio_s": round(first or total, 3),
               "setup_s": round(setup_s, 3), "codec_rtf": round(frames * FRAME_S / total, 3),
               "stream_cpu_s": round(cpu, 3), "full_decode_cpu_s": round(full_cpu, 3)}
        rows.append(row)
        print(f"real codec  {label:<32} {frames} frames: {row['decoded_frames']} decoded in "
              f"{row['calls']} calls, {total:.2f} s streamed vs {full_s:.2f} s one full "
              f"decode, first audio after {row['first_audio_s']:.2f} s"
              + (f" (+{setup_s:.2f} s once per voice)" if setup_s else "")
              + f", codec alone {row['codec_rtf']:.2f}x real time | cpu time {cpu:.2f} s "
              f"streamed vs {full_cpu:.2f} s full", flush=True)

    stream("no reference", StreamDecoder(decoder))
    stream(f"{ref_frames}-frame reference, per chunk", StreamDecoder(decoder, prefix=ref))
    start = _clock()
    primed = StreamDecoder.prime(decoder, ref)
    prime_s, _ = _since(start)
    stream(f"{ref_frames}-frame reference, primed", StreamDecoder(decoder, primed=primed),
           prime_s)
    return rows


def _streamed_rtf(synth: Any, frames: int) -> tuple[float, float, float, float]:
    """(real-time factor, first audio s, audio s, real-time factor by this process's
    CPU time) of one streamed sentence, fixed length."""
    import dataclasses

    from engine.config.speak import SpeakOptions

    class Sink:
        def write(self, audio: Any) -> None:
            pass

    settings = synth.decode_settings
    # every frame made, none cut by end-of-speech: the figure is for `frames` frames
    synth.decode_settings = lambda o: dataclasses.replace(settings(o), stop_at_eos=False)
    try:
        started = _clock()
        speech = synth.speak_stream(SENTENCES[2], Sink(), SpeakOptions(seed=3, max_frames=frames,
                                                                       loudness_lufs=None))
        took, cpu = _since(started)
    finally:
        synth.decode_settings = settings
    return (speech.duration_s / took, speech.first_audio_s or took, speech.duration_s,
            speech.duration_s / cpu)


def bench_extras(name: str, folder: Path, frames: int, dtype: str, device: str,  # noqa: PLR0913
                 int8: bool, tmp: Path, real_codec: bool = False,
                 skip_worker: bool = False, rounds: int = 3,
                 compile_frame: bool = False) -> None:
    import torch

    from engine.model.loading import load_model
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    source = resolve_source(folder)
    wrapper = load_model(folder, device=device, dtype=getattr(torch, dtype))
    synth = Synthesizer(wrapper, source, None)
    synth.use_source(source)
    codec = "tiny codec"
    if real_codec:
        use_real_codec(wrapper.model)
        codec = "real-size codec"
    _first_audio(synth, 4)  # warm-up
    ttfa = _first_audio(synth, frames)
    print(f"{name:<5} {dtype:<8} time to first audio of a streamed sentence ({codec}): "
          f"{ttfa:.3f} s", flush=True)
    rtf, first, audio_s, rtf_cpu = _streamed_rtf(synth, frames)
    print(f"{name:<5} {dtype:<8} streamed playback, {audio_s:.2f} s of audio ({codec}): "
          f"{rtf:.3f}x real time (by CPU time {rtf_cpu:.3f}x), first audio after {first:.2f} s",
          flush=True)
    if synth.fast.device.type == "cuda":
        print(f"{name:<5} CUDA graph: {synth.fast.graph_status}", flush=True)
    elif compile_frame:
        bench_compiled_frame(name, synth, frames)
    if skip_worker:
        if int8 and synth.fast.device.type == "cpu":
            bench_cpu_options(name, folder, wrapper, synth, source, frames, rounds)
        return
    _worker_throughput(synth, 8, 2, 4, tmp)  # warm-up
    one_audio, one_wall = _worker_throughput(synth, 1, 8, frames, tmp)
    many_audio, many_wall = _worker_throughput(synth, 8, 8, frames, tmp)
    one, many = one_audio / one_wall, many_audio / many_wall
    print(f"{name:<5} {dtype:<8} warm worker, 8 concurrent requests of {frames} frames: "
          f"one row at a time {one:.3f} audio s/s, continuous batching (8 rows) "
          f"{many:.3f} audio s/s, x{many / one:.2f}", flush=True)
    if int8 and synth.fast.device.type == "cpu":
        bench_cpu_options(name, folder, wrapper, synth, source, frames, rounds)
    del synth, wrapper
    gc.collect()


def bench_cpu_options(name: str, folder: Path, wrapper: Any, synth: Any, source: Any,
                      frames: int, rounds: int = 3) -> None:
    """CPU options whose output does not depend on the batch (int8 per row, bf16)
    against fp32: teacher-forced agreement, then speed against the official call."""
    import torch

    from engine.model.loading import load_model
    from engine.synth.synthesizer import Synthesizer

    if synth.fast.dtype != torch.float32:
        print(f"{name:<5} CPU options: run with --dtypes float32 (the reference)", flush=True)
        return
    quick = Synthesizer(wrapper, source, None, quantize="int8", fuse=True)
    quick.use_source(source)
    packed16 = Synthesizer(wrapper, source, None, quantize="fp16", fuse=True)
    packed16.use_source(source)
    half_wrapper = load_model(folder, device="cpu", dtype=torch.bfloat16)
    # the same codec for every option (with --real-codec, the published size in fp32)
    half_wrapper.model.speech_tokenizer = wrapper.model.speech_tokenizer
    half = Synthesizer(half_wrapper, source, None)
    half.use_source(source)
    options = {"int8+fuse": quick, "fp16+fuse": packed16, "bf16": half}
    reference = _fp32_reference(synth, frames)
    agreements = _teacher_forced(reference, options, frames)
    weight_only_int8_agreement(folder, synth, frames, reference)
    for label, option in (("int8+fuse", quick), ("fp16+fuse", packed16)):
        rtf, first, audio_s, rtf_cpu = _streamed_rtf(option, frames)
        print(f"{name:<5} {label} streamed playback, {audio_s:.2f} s of audio: {rtf:.3f}x "
              f"real time (by CPU time {rtf_cpu:.3f}x), first audio after {first:.2f} s",
              flush=True)
    speedups: dict[str, tuple[float, float]] = {}
    for label, texts, decode in (("1 sentence", SENTENCES[:1], True),
                                 ("1 sentence", SENTENCES[:1], False)):
        audio_s = len(texts) * frames * FRAME_S
        scope = "end to end" if decode else "generation only"
        everyone = (("fp32", synth), *options.items())
        for _, other in everyone:
            _ours(other, texts, 3, decode)  # warm-up
        # Rounds interleave the official call with every option, and each option's
        # speed-up is the median of its per-round ratios: on a machine whose memory
        # bandwidth is shared with other jobs, both sides of a ratio then see the
        # same neighbours, where back-to-back blocks of one side would not.
        walls: dict[str, list[float]] = {option: [] for option, _ in everyone}
        cpus: dict[str, list[float]] = {option: [] for option, _ in everyone}
        official_walls = []
        for _ in range(rounds):
            w_off, c_off = _official(wrapper, texts, frames, decode)
            official_walls.append(w_off)
            for option, other in everyone:
                w, c = _ours(other, texts, frames, decode)
                walls[option].append(w_off / w)
                cpus[option].append(c_off / c)
        figures = []
        for option, _ in everyone:
            wall_x, cpu_x = statistics.median(walls[option]), statistics.median(cpus[option])
            spread = f"{min(walls[option]):.2f}-{max(walls[option]):.2f}"
            figures.append(f"{option} x{wall_x:.2f} ({spread}, cpu x{cpu_x:.2f})")
            if decode:
                speedups[option] = (wall_x, cpu_x)
        print(f"{name:<5} CPU {label} {scope:<15} | {torch.get_num_threads()} thread(s), "
              f"{rounds} rounds, official fp32 wall RTF "
              f"{audio_s / statistics.median(official_walls):.3f} (median) | ours, median "
              f"speed-up (range): " + ", ".join(figures), flush=True)
    # the issue's target: one sentence end to end, at least 2x the official call at its
    # defaults, with teacher-forced top-1 agreement of at least 99 % against fp32
    for option, (wall_x, cpu_x) in speedups.items():
        top1 = agreements[option].top1 if option in agreements else 1.0
        met = min(wall_x, cpu_x) >= 2 and top1 >= 0.99
        print(f"{name:<5} CPU target {option:<10} x{wall_x:.2f} wall, x{cpu_x:.2f} cpu time "
              f"against the official call, top-1 {top1:.2%}: "
              f"{'met' if met else 'NOT met'} (needs x2 and 99 %)", flush=True)
    del quick, packed16, half, half_wrapper
    gc.collect()


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Soak:
    """A warm worker and its answers by request id, for clients that each wait for their
    answer before asking again."""

    def __init__(self, texts: list[str], tmp: Path) -> None:
        import threading

        from engine.synth.worker import SpeechWorker

        self.answers: dict[str, Any] = {}
        self.cond = threading.Condition()
        self.failures = 0
        self.texts, self.tmp = texts, tmp
        self.worker = SpeechWorker(self._collect, device="cpu", dtype="float32",
                                   rows=8).start()

    def _collect(self, event: Any) -> None:
        rid = event.data.get("request")
        if event.kind in ("result", "error") and rid:
            with self.cond:
                self.answers[rid] = event
                self.cond.notify_all()

    def load(self, folder: Path, ids: list[str]) -> None:
        for rid in ids:
            self.worker.submit({"op": "load", "id": rid, "voice": str(folder)})
        with self.cond:
            self.cond.wait_for(lambda: all(rid in self.answers for rid in ids), 600)

    def ask(self, rid: str, c: int, i: int) -> Any:
        self.worker.submit({"op": "speak", "id": rid, "text": self.texts[i],
                            "out": str(self.tmp / f"soak-{c}.wav"),
                            "options": {"seed": i, "max_frames": 12, "chunk_chars": 80,
                                        "loudness_lufs": None}})
        with self.cond:
            self.cond.wait_for(lambda: rid in self.answers, 600)
            return self.answers.pop(rid)

    def round(self, clients: int, share: int) -> None:
        """`share` requests from `clients` concurrent clients; its audio rate printed."""
        import threading

        todo = list(range(share))
        lock = threading.Lock()
        audio = [0.0]

        def client(c: int) -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                event = self.ask(f"s{clients}-{i}", c, i)
                with lock:
                    if event.kind == "result":
                        audio[0] += event.data["duration_s"]
                    else:
                        self.failures += 1

        began = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - began
        print(f"tiny  warm worker soak, {clients} concurrent client(s): {share} requests in "
              f"{wall:.1f} s, {audio[0] / wall:.2f} audio s/s", flush=True)


def bench_soak(folder: Path, requests: int, tmp: Path) -> None:
    """The warm worker for a long while: `requests` of mixed lengths from 1, 4 and 8
    concurrent clients (each waits for its answer before asking again), process
    memory and threads at the start and the end."""
    import random
    import threading

    rng = random.Random(0)
    texts = [" ".join(rng.sample(SENTENCES, rng.randint(1, 3))) for _ in range(requests)]
    soak = _Soak(texts, tmp)
    soak.load(folder, ["load"])
    start_rss, start_threads = _rss_mib(), threading.active_count()
    for clients in (1, 4, 8):
        soak.round(clients, requests // 3)
    end_rss, end_threads = _rss_mib(), threading.active_count()
    soak.load(folder, [f"again{i}" for i in range(5)])
    print(f"tiny  warm worker soak: {3 * (requests // 3)} requests ({soak.failures} failed); "
          f"process memory {start_rss:.0f} -> {end_rss:.0f} MiB, threads {start_threads} -> "
          f"{end_threads}; after 5 more loads of the same voice: {_rss_mib():.0f} MiB, "
          f"{threading.active_count()} threads", flush=True)
    soak.worker.close(60)


def bench_model(name: str, folder: Path, frames: int, dtype: str,
                device: str = "cpu") -> list[dict[str, Any]]:
    import torch

    from engine.model.loading import load_model
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    source = resolve_source(folder)
    wrapper = load_model(folder, device=device, dtype=getattr(torch, dtype))
    synth = Synthesizer(wrapper, source, None)
    synth.use_source(source)  # the speaker row, as speak() uses it
    # first calls pay one-off costs (allocator, lazy imports): not part of the figure
    _official(wrapper, SENTENCES[:1], 3, True)
    _ours(synth, SENTENCES[:1], 3, True)
    check_greedy(wrapper, synth, frames)
    rows = []
    cases = [("1 sentence", SENTENCES[:1], True), ("1 sentence", SENTENCES[:1], False),
             ("4 sentences", SENTENCES[:4], True), ("4 sentences", SENTENCES[:4], False),
             ("long text", SENTENCES, True)]
    for label, texts, decode in cases:
        audio_s = len(texts) * frames * FRAME_S
        if label == "long text":
            # official: one call on the whole text, all frames in one sequence
            (w_off, c_off) = _official(wrapper, [" ".join(texts)], frames * len(texts),
                                       decode)
        else:
            (w_off, c_off) = _official(wrapper, texts, frames, decode)
        (w_ours, c_ours) = _ours(synth, texts, frames, decode)
        rows.append({"model": name, "dtype": dtype, "case": label,
                     "scope": "end to end" if decode else "generation only",
                     "frames": frames * len(texts), "audio_s": round(audio_s, 2),
                     "official_wall_s": round(w_off, 3), "ours_wall_s": round(w_ours, 3),
                     "official_cpu_s": round(c_off, 3), "ours_cpu_s": round(c_ours, 3),
                     "official_rtf": round(audio_s / w_off, 3),
                     "ours_rtf": round(audio_s / w_ours, 3),
                     "official_rtf_cpu": round(audio_s / c_off, 3),
                     "ours_rtf_cpu": round(audio_s / c_ours, 3)})
        print(_line(rows[-1]), flush=True)
    del synth, wrapper
    gc.collect()
    return rows


def _line(r: dict[str, Any]) -> str:
    return (f"{r['model']:<5} {r['dtype']:<8} {r['case']:<11} {r['scope']:<15} "
            f"{r['frames']:>4} fr | wall RTF official {r['official_rtf']:>6.3f} ours "
            f"{r['ours_rtf']:>6.3f} x{r['official_wall_s'] / r['ours_wall_s']:.2f} | "
            f"cpu-time RTF official {r['official_rtf_cpu']:>6.3f} ours "
            f"{r['ours_rtf_cpu']:>6.3f} x{r['official_cpu_s'] / r['ours_cpu_s']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,0.6b")
    parser.add_argument("--frames", type=int, default=24, help="codec frames per sentence")
    parser.add_argument("--layers", type=int, default=28, help="0.6B talker layers")
    parser.add_argument("--dtypes", default="float32",
                        help="comma list of float32, bfloat16: weights of both sides "
                             "(the official CPU default is float32)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--int8", "--cpu-options", action="store_true",
                        help="also the CPU options (int8 per row, fp16 weights, each + fused "
                             "projections; bf16): "
                             "teacher-forced agreement with fp32 and speed")
    parser.add_argument("--skip-official", action="store_true",
                        help="only the streaming, worker and int8 figures")
    parser.add_argument("--stream-frames", type=int, default=188,
                        help="frames of the real-size codec streaming figure (188 = 15 s); "
                             "0 skips it")
    parser.add_argument("--real-codec", action="store_true",
                        help="the model figures decode with the published codec decoder "
                             "size (random weights) instead of the tiny codec")
    parser.add_argument("--skip-worker", action="store_true",
                        help="leave out the warm worker's 8-request throughput")
    parser.add_argument("--soak", type=int, default=0,
                        help="also this many requests of mixed lengths through the warm "
                             "worker (tiny model): memory and threads, 1/4/8 clients")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads for both sides (default: OMP_NUM_THREADS, 1 "
                             "unless set; the issue's CPU target is for 2 cores)")
    parser.add_argument("--compile-frame", action="store_true",
                        help="CPU: also torch.compile the fixed-shape frame and time it "
                             "against the eager frame (minutes of compiling at 0.6B)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--int8: interleaved official/option rounds per figure (median)")
    parser.add_argument("--ref-frames", type=int, default=125,
                        help="in-context reference frames of that figure (125 = 10 s)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} thread(s), "
          f"{args.frames} frames per sentence, sampling with the model defaults", flush=True)
    rows: list[dict[str, Any]] = []
    if args.stream_frames:
        rows += bench_streaming(args.stream_frames, args.ref_frames, args.device)
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
        work = Path(tmp)
        for name in [m for m in args.models.split(",") if m and m != "none"]:
            if name == "tiny":
                folder = tiny_voice(work)
            elif name == "0.6b":
                folder = voice_06b(work, args.layers)
            else:
                raise SystemExit(f"unknown model {name!r} (tiny, 0.6b)")
            for dtype in args.dtypes.split(","):
                if dtype not in ("float32", "bfloat16"):
                    raise SystemExit(f"unknown dtype {dtype!r}")
                if not args.skip_official:
                    rows += bench_model(name, folder, args.frames, dtype, args.device)
                bench_extras(name, folder, args.frames, dtype, args.device, args.int8, work,
                             args.real_codec, args.skip_worker, args.rounds,
                             args.compile_frame)
        if args.soak:
            bench_soak(tiny_voice(work) if "tiny" not in args.models.split(",")
                       else work / "tiny-voice", args.soak, work)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
