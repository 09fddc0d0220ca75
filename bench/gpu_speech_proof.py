"""The GPU speech proof: Voxshard's own speech path, measured on this machine's GPU.

    python bench/gpu_speech_proof.py --out $OUT     # 0.6B and 1.7B widths; rows + JSON
    python bench/gpu_speech_proof.py --sizes 0.6b --frames 96 --json out.json
    python bench/gpu_speech_proof.py --tiny         # the same script on CPU, tiny model

Beside bench/gpu_proof.py (training), with the same kit (bench/device_kit.sh)
and the same rules: random weights at the real talker widths
(qwen3-tts-facts.md; no download), loaded as the product loads them (bf16 on
a GPU, the official loader with `device_map`), the published codec decoder
size (engine/model/codec_sizes.py, random weights) in place of the tiny codec,
in the loaded codec's dtype (bf16 on a GPU, as the product runs it).
Each size runs in a process of its own (nothing of the 0.6B model is left
when 1.7B loads, and a size that fails is one "failed" row: the next one
runs); its row is printed and appended to `--out` (gpu_speech_proof.jsonl)
the moment it ends. `--budget-s` starts a size only when its estimate fits in
the time left and stops one still running at the limit (bench/proof_rows.py's Budget).
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
- the warm worker (continuous batching, 8 rows) under 8 concurrent requests,
  its frame graphs captured before the clock starts (`ContinuousBatcher.prepare`,
  as the worker does at load);
- peak GPU memory after loading and, reset then, while serving;
- operators per static frame at batch 1 (each a kernel and a graph node on a GPU;
  the tiny model on CPU: 1574), what bounds a replayed frame's time there.
Without the kit it names what is missing in one line (exit 2); without a GPU
(and without --tiny) it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401

from bench.proof_kit import check_environment
from bench.proof_rows import Budget
from engine.core.jsonl import append_jsonl

#: talker widths over the 0.6B template (qwen3-tts-facts.md); "tiny": the test model
SIZES: dict[str, dict[str, Any]] = {
    "0.6b": {},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144},
}
#: modules the speech path needs beyond the training proof's (the loudness meter)
SPEECH_NEEDS = (("pyloudnorm", "the device kit"),)
ROWS_FILE = "gpu_speech_proof.jsonl"
GIB = float(1 << 30)


def _bench_synth() -> Any:
    spec = importlib.util.spec_from_file_location("bench_synth", ROOT / "bench" / "bench_synth.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Clock:
    """Wall time after the device's queued work, and the peak memory (the GPU's, or on the
    CPU the process's resident peak, which cannot be reset)."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda, self.torch = cuda, torch

    def sync(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def peak_gib(self) -> float:
        import resource

        if self.cuda:
            return round(self.torch.cuda.max_memory_allocated() / GIB, 2)
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20), 2)


def _load(size: str, work: Path, clock: _Clock, bs: Any) -> tuple[Any, dict[str, Any]]:
    """The size's voice loaded as the product loads it, with the real-size codec; the
    synthesizer and the row's load figures."""
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    device = "cuda" if clock.cuda else "cpu"
    folder = (bs.tiny_voice(work) if size == "tiny"
              else bs.voice_06b(work, 28, SIZES[size], name=size.replace(".", "")))
    began = clock.sync()
    # dtype as the product chooses it (bf16 on a GPU)
    synth = Synthesizer.load(resolve_source(folder), device=device)
    load_s = clock.sync() - began
    bs.use_real_codec(synth.model)
    fast = synth.fast
    codec_dtype = next(synth.model.speech_tokenizer.model.decoder.parameters()).dtype
    return synth, {"size": size, "device": device, "dtype": str(fast.dtype),
                   "codec_dtype": str(codec_dtype), "load_s": round(load_s, 2),
                   "graphs_at_load": fast.graph_status, "peak_gib_after_load": clock.peak_gib()}


def _captures(fast: Any) -> int:
    batches = getattr(fast, "_row_batches", {})
    return sum(getattr(rows, "capture_attempts", 0) for rows in batches.values())


def _generation(synth: Any, bs: Any, frames: int, clock: _Clock, row: dict[str, Any]) -> None:
    """A cold request's first audio, replayed codes against the eager frame and loop, and
    generation's real-time factor (one sentence, fixed length)."""
    import dataclasses

    import torch

    from engine.config.speak import SpeakOptions
    from engine.synth.prompt import build_prefill

    fast = synth.fast
    # a cold request: first audio with the graphs captured at load
    before = _captures(fast)
    row["first_audio_s"] = round(bs._first_audio(synth, frames), 3)
    row["captures_in_first_request"] = _captures(fast) - before
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
    began = clock.sync()
    fast.generate(prefill, [frames], settings, seeds=[1])
    gen_s = clock.sync() - began
    row["generation_rtf"] = round(frames * bs.FRAME_S / gen_s, 2)
    row["graphs_after_runs"] = fast.graph_status
    row["kernels_per_frame"] = kernels_per_frame(fast, settings)


def _serving(synth: Any, bs: Any, frames: int, work: Path, clock: _Clock,
             row: dict[str, Any]) -> None:
    """End to end streamed through the real-size codec, then the warm worker: 8
    concurrent requests on 8 rows, against one row at a time."""
    from engine.config.speak import SpeakOptions

    class Sink:
        def write(self, audio: Any) -> None:
            pass

    began = clock.sync()
    speech = synth.speak_stream(bs.SENTENCES[1], Sink(), SpeakOptions(seed=2, max_frames=frames))
    row["streamed_rtf"] = round(speech.duration_s / (clock.sync() - began), 2)
    audio1, wall1 = bs._worker_throughput(synth, 1, 8, frames, work)
    audio8, wall8 = bs._worker_throughput(synth, 8, 8, frames, work)
    row["worker_1_row_audio_s_per_s"] = round(audio1 / wall1, 2)
    row["worker_8_rows_audio_s_per_s"] = round(audio8 / wall8, 2)
    row["peak_gib_serving"] = clock.peak_gib()


def prove(size: str, work: Path, frames: int) -> dict[str, Any]:
    """One size, in this process: every figure of the module docstring, as one row."""
    bs = _bench_synth()
    clock = _Clock(size != "tiny")
    synth, row = _load(size, work, clock, bs)
    if clock.cuda:
        clock.torch.cuda.reset_peak_memory_stats()
    _generation(synth, bs, frames, clock, row)
    _serving(synth, bs, frames, work, clock, row)
    return row


def kernels_per_frame(fast: Any, settings: Any) -> int:
    """Operators one static frame launches (each a kernel on a GPU, a node of its graph),
    counted by a dispatch mode over one eager frame of a one-row batch: what bounds a
    captured frame's replay at batch 1 (issue 29 point 6)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from engine.synth.sampling import noise_width

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            self.ops += 1
            return func(*args, **(kwargs or {}))

    width = max(noise_width(settings.talker, fast.vocab),
                noise_width(settings.predictor, fast.p_vocab), 1)
    rows = fast.row_batch(1, 256, 64, 128, settings, width)
    rows.key_valid[:, 0] = True
    with torch.inference_mode():
        rows.frame(rows.span_for(0))  # warm: lazy buffers are not the frame's own
        count = Count()
        with count:
            rows.frame(rows.span_for(0))
    return count.ops


def run_size(size: str, args: argparse.Namespace, work: Path,
             deadline: float | None) -> dict[str, Any]:
    """`size` in a child process of its own: its row, or one line saying why there is none."""
    row_file = work / f"row-{size}.json"
    errors = work / f"stderr-{size}.txt"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", size,
           "--frames", str(args.frames), "--row-file", str(row_file)]
    with open(errors, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=err)
        try:
            proc.wait(None if deadline is None else max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return {"size": size, "stopped": True}
    if proc.returncode == 0 and row_file.is_file():
        return json.loads(row_file.read_text())
    tail = [line for line in errors.read_text(errors="replace").splitlines() if line.strip()]
    sys.stderr.write("\n".join(tail[-25:]) + "\n")
    last = tail[-1].strip()[:300] if tail else f"exit code {proc.returncode}"
    return {"size": size, "error": last}


def _child(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="gpu-speech-") as tmp:
        row = prove(args.child, Path(tmp), args.frames)
    Path(args.row_file).write_text(json.dumps(row))
    return 0


def _passed(row: dict[str, Any]) -> bool:
    """A measured row that holds, or a size not measured for want of time; not a failure."""
    if "skipped" in row or row.get("stopped"):
        return True
    if "error" in row:
        return False
    graphs = row["device"] != "cuda" or (row["graphs_at_load"] == "captured"
                                         and row["captures_in_first_request"] == 0)
    return graphs and bool(row["replay_equals_static_eager"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0.6b,1.7b")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU and the tiny model: the same path, rehearsed without a GPU")
    parser.add_argument("--frames", type=int, default=None,
                        help="codec frames per sentence (default 96; 24 with --tiny)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="seconds the proof may take (0: no limit); a size is started "
                             "only if its estimate fits, one running at the limit is stopped")
    parser.add_argument("--out", default=None, help="folder for the rows as they finish")
    parser.add_argument("--json", help="also write the rows to this file at the end")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--row-file", help=argparse.SUPPRESS)
    return parser


def _cannot_measure(args: argparse.Namespace, sizes: list[str]) -> int | None:
    """The exit code, said in one line, where this machine cannot run the proof: the kit
    missing or an unknown size (2), no GPU (0); None where it can."""
    missing = check_environment(SPEECH_NEEDS)
    if missing:
        print(missing.replace("gpu_proof:", "gpu_speech_proof:", 1))
        return 2
    unknown = [s for s in sizes if s != "tiny" and s not in SIZES]
    if unknown:
        print(f"gpu_speech_proof: unknown size {', '.join(unknown)}; use {', '.join(SIZES)} "
              "(or --tiny on CPU).")
        return 2
    if not args.tiny and not Path("/dev/nvidiactl").exists() and not shutil.which("nvidia-smi"):
        # said before importing torch (seconds on a busy machine)
        print("gpu_speech_proof: no GPU here (no NVIDIA driver); nothing was measured (use "
              "--tiny for the CPU run of the same path).")
        return 0
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print("gpu_speech_proof: no GPU here (torch.cuda.is_available() is False); "
              "nothing was measured (use --tiny for the CPU run of the same path).")
        return 0
    return None


def _run_sizes(sizes: list[str], args: argparse.Namespace, budget: Budget,
               out: Path | None) -> list[dict[str, Any]]:
    """Each size in its own process as the budget allows; each row printed and appended
    to `out` the moment it ends."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-speech-") as tmp:
        for size in sizes:
            if not budget.may_start(size, "speech"):
                row: dict[str, Any] = {"size": size, "skipped": "the time budget is spent"}
            else:
                began = time.monotonic()
                row = run_size(size, args, Path(tmp), budget.deadline)
                budget.record(size, "speech", time.monotonic() - began)
                row["wall_s"] = round(time.monotonic() - began, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if out is not None:
                append_jsonl(out / ROWS_FILE, row)
    return rows


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = _parser().parse_args(argv)
    args.frames = args.frames or (24 if args.tiny else 96)
    if args.child:
        return _child(args)
    sizes = ["tiny"] if args.tiny else [s for s in args.sizes.split(",") if s]
    refused = _cannot_measure(args, sizes)
    if refused is not None:
        return refused
    import torch

    from engine.train.gpus import visible_gpus

    gpus = [] if args.tiny else visible_gpus()  # NVML: no CUDA context in this process
    print(f"gpu_speech_proof: torch {torch.__version__}, {gpus[0].name if gpus else 'CPU'}, "
          f"{args.frames} frames per sentence, random weights", flush=True)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / ROWS_FILE).write_text("")
    budget = Budget(args.budget_s, started)
    # a size not yet measured is estimated from a smaller one by the talker's parameters
    budget.weights.update({"tiny": 1.0, "0.6b": 1.0, "1.7b": 2.8})
    rows = _run_sizes(sizes, args, budget, out)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r.get(k, "-")) for k in keys))
    print(f"wall {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(_passed(r) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
