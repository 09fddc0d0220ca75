"""The GPU speech proof: Voxshard's own speech path, measured on this machine's GPU.

    python bench/gpu_speech_proof.py                 # 0.6B and 1.7B widths; table + JSON
    python bench/gpu_speech_proof.py --sizes 0.6b --frames 96 --json out.json

Beside bench/gpu_proof.py (training), with the same kit (bench/device_kit.sh)
and the same rules: random weights at the real talker widths
(qwen3-tts-facts.md; no download), bf16, the published codec decoder size
(engine/model/codec_sizes.py, random weights) in place of the tiny codec.
Per size it checks and prints:
- graphs: the frame graphs are captured when the model loads
  (`FastTalker.prepare`), so the first request replays them; the state after
  the first request must still be "captured" (no failed or new captures);
- replay = eager: greedy codes of the captured loop equal those of the same
  static frame run eagerly (same kernels), and how many frames the unmasked
  eager loop agrees on (attention over a padded span may round differently);
- real-time factor of one sentence (generation alone, fixed length) and end to
  end streamed (speak_stream with the real-size codec), and the time to the
  first audio of a cold request;
- the warm worker (continuous batching, 8 rows) under 8 concurrent requests.
Without a GPU it says so in one line and exits 0 (nothing is measured).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: talker widths over the 0.6B template (qwen3-tts-facts.md)
SIZES: dict[str, dict[str, Any]] = {
    "0.6b": {},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144},
}


def _bench_synth() -> Any:
    spec = importlib.util.spec_from_file_location("bench_synth", ROOT / "bench" / "bench_synth.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sync() -> float:
    import torch

    torch.cuda.synchronize()
    return time.perf_counter()


def prove(size: str, work: Path, frames: int) -> dict[str, Any]:
    import dataclasses

    import torch

    from engine.config.speak import SpeakOptions
    from engine.model.codec_sizes import REAL_DECODER_CONFIG, build_decoder
    from engine.synth.prompt import build_prefill
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    bs = _bench_synth()
    folder = bs.voice_06b(work, 28, SIZES[size], name=size.replace(".", ""))
    began = _sync()
    synth = Synthesizer.load(resolve_source(folder), device="cuda", dtype="bfloat16")
    load_s = _sync() - began
    # the published codec decoder size in place of the tiny test codec (fp32, as loaded)
    tokenizer = synth.model.speech_tokenizer.model
    tokenizer.decoder = build_decoder(REAL_DECODER_CONFIG, seed=0).to("cuda")
    fast = synth.fast
    row: dict[str, Any] = {"size": size, "load_s": round(load_s, 2),
                           "graphs_at_load": fast.graph_status}
    # a cold request: first audio with the graphs captured at load

    def captures() -> int:
        return sum(rows.capture_attempts for rows in fast._row_batches.values())

    before = captures()
    first = bs._first_audio(synth, frames)
    row["first_audio_s"] = round(first, 3)
    row["captures_in_first_request"] = captures() - before
    row["graphs_after_first_request"] = fast.graph_status
    # replayed codes against the same static frame run eagerly, greedy, fixed length
    greedy = synth.decode_settings(SpeakOptions(do_sample=False, subtalker_do_sample=False))
    greedy = dataclasses.replace(greedy, stop_at_eos=False)
    prefill = build_prefill(synth.model, synth.processor, [bs.SENTENCES[0]],
                            synth.speaker_vector, None, True)
    replayed = fast.generate(prefill, [frames], greedy, static=True, graphs=True)[0]
    static_eager = fast.generate(prefill, [frames], greedy, static=True, graphs=False)[0]
    loop_eager = fast.generate(prefill, [frames], greedy, static=False)[0]
    row["replay_equals_static_eager"] = bool(torch.equal(replayed, static_eager))
    same = (replayed == loop_eager).all(dim=1)
    row["frames_equal_to_eager_loop"] = f"{int(same.cumprod(0).sum())}/{frames}"
    # generation alone, one sentence, sampled with the defaults, fixed length
    settings = dataclasses.replace(synth.decode_settings(SpeakOptions()), stop_at_eos=False)
    fast.generate(prefill, [frames], settings, seeds=[0])  # same shape: replays
    began = _sync()
    fast.generate(prefill, [frames], settings, seeds=[1])
    gen_s = _sync() - began
    row["generation_rtf"] = round(frames * bs.FRAME_S / gen_s, 2)
    row["graphs_after_runs"] = fast.graph_status
    # end to end, streamed through the real-size codec

    class Sink:
        def write(self, audio: Any) -> None:
            pass

    began = _sync()
    speech = synth.speak_stream(bs.SENTENCES[1], Sink(), SpeakOptions(seed=2, max_frames=frames))
    total = _sync() - began
    row["streamed_rtf"] = round(speech.duration_s / total, 2)
    # the warm worker: 8 concurrent requests on 8 rows, against one row at a time
    audio1, wall1 = bs._worker_throughput(synth, 1, 8, frames, work)
    audio8, wall8 = bs._worker_throughput(synth, 8, 8, frames, work)
    row["worker_1_row_audio_s_per_s"] = round(audio1 / wall1, 2)
    row["worker_8_rows_audio_s_per_s"] = round(audio8 / wall8, 2)
    row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del synth
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.6b,1.7b")
    parser.add_argument("--frames", type=int, default=96, help="codec frames per sentence")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if not Path("/dev/nvidiactl").exists() and not shutil.which("nvidia-smi"):
        # said before importing torch (seconds on a busy machine)
        print("gpu_speech_proof: no GPU here (no NVIDIA driver); nothing was measured.")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_speech_proof: no GPU here (torch.cuda.is_available() is False); "
              "nothing was measured.")
        return 0
    for size in args.sizes.split(","):
        if size not in SIZES:
            raise SystemExit(f"unknown size {size!r} (0.6b, 1.7b)")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {args.frames} frames "
          "per sentence, bf16, random weights", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-speech-") as tmp:
        for size in args.sizes.split(","):
            rows.append(prove(size, Path(tmp), args.frames))
            print(json.dumps(rows[-1]), flush=True)
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    ok = all(r["graphs_at_load"] == "captured" and r["replay_equals_static_eager"]
             and r["captures_in_first_request"] == 0 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
