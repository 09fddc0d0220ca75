"""The memory plan against the measured peak of a real CPU run's whole process tree.

    python bench/bench_plan_peak.py [--layers 4] [--workers 2] [--batch 2] [--steps 3]
    python bench/bench_plan_peak.py --tiny

Builds a model folder (the tiny test model with `--tiny`, else random weights at the
published 0.6B widths with `--layers` talker layers: 28 is the real depth, about 915M
parameters, and peaks near 22 GiB with 2 workers), a voice of synthetic clips, asks the
product for its dry-run plan, then runs `voxshard-engine train --cpu` as a child process
and samples the memory of that process and every process under it (Ray's GCS and raylet,
its agents, idle workers, Ray Train's controller, the ranks) every `--interval` seconds:
PSS (shared pages split between the processes that map them, so the sum is what the
tree holds) and RSS. It prints, per kind of process, the plan's term next to the
measured peak, and the whole tree's peak next to the plan's whole-host figure. The drop
of the machine's available memory is printed too; on a shared machine it includes
other people's work.

The constants of `engine.train.plan` (`DRIVER_BYTES`, `TRAIN_CONTROLLER_BYTES`,
`RAY_PROCESS_BYTES`, `CPU_RUNTIME_BYTES`) were derived from this bench's tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GIB = float(1 << 30)

from engine.audio.timebase import SAMPLE_RATE
from engine.train.plan import DRIVER, RAY_PROCESSES, TRAIN_CONTROLLER

# -- the model and the voice ----------------------------------------------------------------

def real_width_model(out: Path, template: Path, layers: int, text_vocab: int | None) -> Path:
    """`template` (the tiny model: tokenizer, codec) with a talker at the published 0.6B
    widths and `layers` layers (and `text_vocab` text embedding rows instead of the
    published 151936), and a speaker encoder of that width; random bf16 weights."""
    if (out / "model.safetensors").exists():
        return out
    import torch
    from safetensors.torch import save_file

    from bench.bench_train import REAL_06B
    from engine.model.official import configuration, modeling
    from engine.train.objective import build_talker

    # the codec's own weights (speech_tokenizer/model.safetensors) come along
    shutil.copytree(template, out, ignore=lambda folder, names: (
        ["model.safetensors"] if Path(folder) == template else []))
    cfg = json.loads((template / "config.json").read_text())
    talker = cfg["talker_config"]
    talker.update(REAL_06B["talker"], num_hidden_layers=layers)
    if text_vocab:
        talker["text_vocab_size"] = text_vocab
    talker.setdefault("rope_scaling", {})["mrope_section"] = [24, 20, 20]
    talker["code_predictor_config"].update(REAL_06B["code_predictor"])
    for sub in (talker, talker["code_predictor_config"]):
        if "layer_types" in sub:
            sub["layer_types"] = ["full_attention"] * int(sub["num_hidden_layers"])
    cfg["speaker_encoder_config"]["enc_dim"] = talker["hidden_size"]
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = torch.Generator().manual_seed(0)
    # built on meta, each tensor drawn alone in bf16: no fp32 copy of the whole model
    state = {f"talker.{name}": (torch.randn(p.shape, generator=gen) * 0.02).to(torch.bfloat16)
             for name, p in build_talker(out, "meta").named_parameters()}
    enc = modeling().Qwen3TTSSpeakerEncoder(
        configuration().Qwen3TTSConfig.from_pretrained(str(out)).speaker_encoder_config)
    state.update({f"speaker_encoder.{k}": v.to(torch.bfloat16).contiguous()
                  for k, v in enc.state_dict().items()})
    save_file(state, str(out / "model.safetensors"))
    return out


def synthetic_voice(out: Path, clips: int, seconds: float) -> Path:
    """A prepared voice of `clips` tones with a little noise, `seconds` long each."""
    import numpy as np
    import soundfile as sf

    from engine.layout.voice import create_voice

    if out.exists():
        return out
    voice = create_voice(out, "Bench")
    folder = voice.prepared.path / "clips"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    lines = []
    for i in range(clips):
        audio = 0.2 * np.sin(2 * np.pi * (140 + 9 * i) * t) + 0.02 * rng.standard_normal(t.size)
        sf.write(folder / f"c{i}.wav", audio.astype("float32"), SAMPLE_RATE)
        lines.append(json.dumps({"id": f"c{i}", "path": f"prepared/clips/c{i}.wav",
                                 "text": f"A sentence of ordinary length, number {i}.",
                                 "duration_s": seconds, "sample_rate": SAMPLE_RATE, "usable": True,
                                 "issues": [], "source_take": f"t{i}"}))
    (voice.prepared.path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return out


# -- sampling the tree ----------------------------------------------------------------------

def process_kind(proc: Any, root: int, ranks: dict[int, int]) -> str:
    """What a process of the run is, from its pid and command line."""
    if proc.pid == root:
        return DRIVER
    if proc.pid in ranks:
        return f"rank {ranks[proc.pid]}"
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except Exception:
        return "gone"
    if cmd.startswith("ray::RayTrainWorker"):
        return "rank ?"
    if cmd.startswith("ray::TrainController"):
        return TRAIN_CONTROLLER
    if cmd.startswith("ray::IDLE"):
        return "Ray: idle worker"
    if cmd.startswith("ray::"):
        return "Ray: actor " + cmd.split()[0].removeprefix("ray::").split(".")[0]
    for known in ("gcs_server", "raylet", "dashboard/agent.py", "runtime_env/agent",
                  "log_monitor.py", "monitor.py"):
        if known in cmd or known == name:
            return "Ray: " + known.split("/")[0].removesuffix(".py")
    return "other: " + name


@dataclass
class Tree:
    """Peaks of one process tree, sampled until `stop` is set."""

    root: int
    interval: float
    ranks: dict[int, int] = field(default_factory=dict)
    #: the largest sum over the tree, PSS, and what each kind held at that moment
    peak: int = 0
    at_peak: dict[str, int] = field(default_factory=dict)
    #: each process's own peak (PSS, RSS), by pid, with its kind
    per_process: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    samples: int = 0
    min_available: int = 1 << 62
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        import psutil

        try:
            top = psutil.Process(self.root)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            return
        total, kinds = 0, {}
        for p in procs:
            try:
                mem = p.memory_full_info()
            except psutil.Error:
                continue
            kind = process_kind(p, self.root, self.ranks)
            total += mem.pss
            kinds[kind] = kinds.get(kind, 0) + mem.pss
            was = self.per_process.get(p.pid, (kind, 0, 0))
            # a rank is named once the driver has said its pid; a process that ended
            # keeps the kind it was seen with
            known = was[0] if kind == "gone" or (kind == "rank ?" and was[0] != "gone") \
                else kind
            self.per_process[p.pid] = (known, max(was[1], mem.pss), max(was[2], mem.rss))
        self.samples += 1
        self.min_available = min(self.min_available, psutil.virtual_memory().available)
        if total > self.peak:
            self.peak, self.at_peak = total, kinds

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            self.sample()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - t)))


def run_measured(args: argparse.Namespace, model: Path, voice: Path, run: str) -> Tree:
    """`voxshard-engine train` as a child process, its tree sampled until it ends."""
    import psutil

    cmd = [str(Path(sys.executable).with_name("voxshard-engine")), "--json", "train",
           str(voice), "--base", str(model), "--cpu", "--workers", str(args.workers),
           "--batch-size", str(args.batch), "--steps", str(args.steps),
           "--checkpoint-every", str(max(1, args.steps - 1)), "--val-every", "2",
           "--run", run]
    if args.lora:
        cmd += ["--trainable", "lora"]
    # a loaded machine starts Ray's processes slowly
    env = {**os.environ, "RAY_raylet_start_wait_time_s": "600"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    tree = Tree(proc.pid, args.interval)
    tree.min_available = psutil.virtual_memory().available
    sampler = threading.Thread(target=tree.run, daemon=True)
    sampler.start()
    errors: list[str] = []
    stderr = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
    stderr.start()
    result = None
    try:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "state" and event.get("state") == "worker_started":
                tree.ranks[int(event["pid"])] = int(event["rank"])
            if event.get("event") == "result":
                result = event
            if event.get("event") == "error":
                print("bench_plan_peak: the run failed:", event.get("message"),
                      event.get("hint"))
        proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the run stops cleanly and shuts Ray down
            proc.terminate()
            proc.wait(timeout=120)
        tree.stop.set()
        sampler.join()
    if proc.returncode != 0 and result is None:
        print("".join(errors[-30:]))
        raise SystemExit(f"bench_plan_peak: the run ended with {proc.returncode}")
    return tree


def plan_terms(plan: dict[str, Any]) -> dict[str, int]:
    """The plan's figure for each kind of process the bench tells apart."""
    terms = {f"rank {r}": int(plan["total"]) for r in range(int(plan["workers"]))}
    terms.update({k: int(v) for k, v in (plan.get("host_terms") or {}).items()})
    return terms


def group_of(kind: str, terms: dict[str, int]) -> str:
    """The plan's term a measured kind of process falls under."""
    if kind in terms:
        return kind
    if kind.startswith("Ray: ") or kind.startswith("other: "):
        return RAY_PROCESSES
    return kind


def report(tree: Tree, plan: dict[str, Any], available_before: int) -> str:
    terms = plan_terms(plan)
    peaks: dict[str, int] = {}
    counts: dict[str, int] = {}
    for kind, pss, _rss in tree.per_process.values():
        g = group_of(kind, terms)
        peaks[g] = peaks.get(g, 0) + pss
        counts[g] = counts.get(g, 0) + 1
    at_peak: dict[str, int] = {}
    for kind, b in tree.at_peak.items():
        g = group_of(kind, terms)
        at_peak[g] = at_peak.get(g, 0) + b
    lines = [f"{'process':<34}{'plan GiB':>9}{'peak GiB':>10}{'at tree peak':>14}  processes"]
    for g in sorted(set(terms) | set(peaks)):
        plan_s = f"{terms[g] / GIB:9.2f}" if g in terms else f"{'-':>9}"
        lines.append(f"{g:<34}{plan_s}{peaks.get(g, 0) / GIB:10.2f}"
                     f"{at_peak.get(g, 0) / GIB:14.2f}  {counts.get(g, 0)}")
    host = int(plan.get("host_total") or plan["total"] * plan["workers"])
    lines.append(f"{'whole tree (PSS sum)':<34}{host / GIB:9.2f}{tree.peak / GIB:10.2f}"
                 f"{'':>14}  {len(tree.per_process)} seen, {tree.samples} samples")
    lines.append(f"the machine's available memory fell by "
                 f"{(available_before - tree.min_available) / GIB:.2f} GiB at most "
                 f"(from {available_before / GIB:.2f}; other work included)")
    lines.append("plan >= peak" if host >= tree.peak else
                 f"PLAN BELOW THE PEAK by {(tree.peak - host) / GIB:.2f} GiB")
    lines.append("each process (kind, peak PSS, peak RSS GiB): " + ", ".join(
        f"{k} {p / GIB:.2f}/{r / GIB:.2f}" for k, p, r in
        sorted(tree.per_process.values(), key=lambda x: -x[1]) if p > 0.02 * GIB))
    return "\n".join(lines)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    import psutil

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny test model")
    ap.add_argument("--layers", type=int, default=4,
                    help="talker layers at the 0.6B widths (28: the real model, ~22 GiB)")
    ap.add_argument("--text-vocab", type=int, default=None,
                    help="text embedding rows (default: the published 151936; fewer make "
                         "a mid-size model whose run fits beside other work)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each clip")
    ap.add_argument("--lora", action="store_true", help="train LoRA adapters")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("--work", type=Path, default=Path("/tmp/voxshard-bench-plan-peak"))
    args = ap.parse_args()
    # `timeout` and kill send SIGTERM: end the run (and its Ray processes) with the bench
    signal.signal(signal.SIGTERM, _interrupt)

    from engine.model.tiny import make_tiny_model
    from engine.train.driver import train

    args.work.mkdir(parents=True, exist_ok=True)
    tiny = args.work / "tiny"
    if not (tiny / "config.json").exists():
        make_tiny_model(tiny, seed=0)
    vocab = f"-v{args.text_vocab}" if args.text_vocab else ""
    model = tiny if args.tiny else real_width_model(
        args.work / f"w06b-{args.layers}l{vocab}", tiny, args.layers, args.text_vocab)
    # a voice per model: its codes and x-vector are the model's
    voice = synthetic_voice(args.work / f"voice-{model.name}-{args.clips}x{args.seconds:g}",
                            args.clips, args.seconds)
    dry = train(voice, str(model), workers=args.workers, batch_size=args.batch,
                steps=args.steps, use_gpu=False, dry_run=True,
                trainable="lora" if args.lora else None)
    print(dry["summary"])
    run = f"peak-{int(time.time())}"
    before = psutil.virtual_memory().available
    tree = run_measured(args, model, voice, run)
    size = "tiny model" if args.tiny else (
        f"0.6B widths, {args.layers} talker layers, {args.text_vocab or 151936} text rows")
    print(f"\n{size}, {args.workers} CPU workers, batch {args.batch}, {args.steps} steps "
          f"({'LoRA' if args.lora else 'full'}), sampled every {args.interval:g} s:")
    print(report(tree, dry["plan"], before))
    shutil.rmtree(voice / "runs" / run, ignore_errors=True)


if __name__ == "__main__":
    main()
