"""The GPU proof: Voxshard's own training path, measured on the GPUs of this machine.

    python bench/gpu_proof.py --out $OUT    # every visible GPU; a table, row by row, and JSON
    python bench/gpu_proof.py --tiny        # the same script on CPU with the tiny model
    python bench/gpu_proof.py --json out.json --sizes 0.6b --steps 6 --budget-s 0

What runs, per model size (random weights at the real 0.6B and 1.7B widths
from qwen3-tts-facts.md, written once to a cache folder; no download) and per
configuration (plain, activation checkpointing, CPU offload, LoRA, the
decoder layers compiled with torch.compile, and 4 accumulation micro-steps
with parameters kept gathered between them or gathered again in each):
the product's objective, `parallelize`, worker loop (`engine.train.trainer.
run_worker`: AdamW, schedule, clipping, precision and loss scaling, metrics)
and DCP checkpointer, on synthetic batches in the real sequence layout.
The loop is started by `torch.distributed` directly (one process per GPU), so
this runs where Ray cannot be installed; with `--tiny` (or `--ray` where Ray
is installed) the same loop also runs through Ray Train (`engine.train.launch`)
and its losses must equal the Ray-free run's.

Each configuration runs in processes of its own, and its row is printed and
appended to `--out` (gpu_proof.jsonl, gpu_proof.txt) the moment it ends: a
configuration whose process raises or dies is one "failed" row and the next
one starts; a proof killed at its command's time limit keeps every row before.
`--budget-s` (default 540: one 10-minute command) starts a configuration only
when its estimate fits in the time left and stops one still running at the
limit. The default order measures every configuration at 0.6B, then 1.7B's
plain, offload and LoRA first. Threads per process are the product's
(`engine.train.resolve.worker_threads`: under CPU offload AdamW runs on the
host, on all its cores); the sockets and GPU numbering too
(`engine.train.process_env`).

Checked and printed per configuration: final loss; for plain and LoRA one save
just past the middle step (the run's only save), resume from it, and the
resumed steps' losses equal to the uninterrupted run
(`resume_equal`); allocator peak and device-level used memory per GPU against
the plan's prediction; step time, tokens/s and model FLOPs utilisation (MFU:
model FLOPs of the step, see `model_flops`, over the GPU's bf16 dense peak;
recomputation by activation checkpointing is not counted as useful). With 2+
GPUs, N=2 runs too, and its per-rank model state against N=1.

Before anything else it checks that every module it needs imports, and
that transformers is the 4.57 line the official model code is written for;
what is missing is named in one line with how to get it (the device kit:
bench/device_kit.sh), exit 2, no traceback. Without a GPU (and without
--tiny) it says so in one line and exits 0. This module never imports ray at
import time (the GPU machine may lack it), and the parent process never
creates a CUDA context: the model folder is written from CPU and the GPU's
name is read through NVML, so the children measure a device nobody else holds.

Resumed against uninterrupted losses: equal on CPU (same kernels, same order);
on a GPU within a relative 5e-3 (`RESUME_RTOL`), because the fused attention
backward accumulates with atomics and is not deterministic, so the two runs'
bf16 weights drift apart by rounding from the first step.

MFU is measured over a sweep of micro-batch sizes (`--batch 4,16,32,...`),
each run only when the plan says it fits the GPU's free memory: 4 clips of
10 s is ~660 tokens, which measures launch overhead, not the trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401

from bench.proof_figures import GIB, model_flops, peak_flops, plan_bytes, summarise
from bench.proof_kit import check_environment, gpu_name
from bench.proof_model import SIZES, make_model_dir
from bench.proof_reinforce import reinforce_row
from bench.proof_rows import Budget, RowLog
from bench.proof_run import run_config, run_ray
from engine.audio.timebase import FRAME_RATE

CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "checkpointing": {"parallel": {"activation_checkpointing": True}},
    "offload": {"parallel": {"cpu_offload": True}},
    "lora": {"model": {"trainable": "lora"}},
    # torch.compile of every decoder layer (GPU only: on CPU the layers stay eager)
    "compiled": {"parallel": {"compile_layers": True}},
    # 4 micro-steps per optimizer step, parameters kept gathered between them and not:
    # the all-gathers that keeping saves, in step time
    "accum4 kept": {"data": {"grad_accum": 4}, "parallel": {"accum_reduce": "last",
                                                             "keep_gathered": "on"}},
    "accum4 regather": {"data": {"grad_accum": 4}, "parallel": {"accum_reduce": "last",
                                                                 "keep_gathered": "off"}},
    # the code predictor on a quarter of each step's frames (issue 32 §2): step time and
    # memory against plain
    "predictor 1/4": {"model": {"predictor_frames": 0.25}},
}
#: configurations that only mean something on a GPU
GPU_ONLY = ("offload", "compiled")
#: after the first size, a larger one starts with these (then the rest, while time lasts)
LARGER_FIRST = ("plain", "offload", "lora")


def _sweep(model_dir: Path, base: Any, batches: list[int], world: int,
           args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Plain configurations at larger micro-batches, each only if the plan says it fits."""
    from engine.train.plan import gpu_free_memory, make_plan

    frames = max(2, int(args.seconds * FRAME_RATE))
    seq = frames + max(2, int(args.seconds * 3)) + 14
    free = gpu_free_memory()
    out: dict[str, dict[str, Any]] = {}
    for b in batches:
        cfg = base.replace(data={"batch_size": b}, parallel={"workers": world})
        plan = make_plan(model_dir, cfg, device="cuda", free=free, seq_len=seq, frames=frames,
                         choices=False)
        if plan.fits:
            out[f"plain b{b}"] = {"data": {"batch_size": b}}
        else:
            print(f"gpu_proof: batch {b} skipped, the plan needs {plan.total / GIB:.1f} GiB per "
                  "GPU", flush=True)
    return out


def size_order(names: list[str], size: str) -> list[str]:
    """0.6B measures every configuration in the order given; a larger size (also when
    it is measured alone) starts with those that say most about it (`LARGER_FIRST`),
    then the rest."""
    if size == next(iter(SIZES)):
        return list(names)
    return [n for n in LARGER_FIRST if n in names] + [n for n in names if n not in LARGER_FIRST]


def _added_configs(specs: list[str]) -> dict[str, dict[str, Any]]:
    """--add-config NAME=JSON: configuration overrides by section, and optionally the
    loop's "builder" ("module:function")."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        try:
            value = json.loads(text) if sep else None
        except ValueError:
            value = None
        if not name or not isinstance(value, dict):
            raise SystemExit(f"gpu_proof: --add-config {spec!r} is not NAME=JSON object; write "
                             "e.g. --add-config 'b64={\"data\": {\"batch_size\": 64}}'.")
        out[name] = value
    return out


# -- main -------------------------------------------------------------------------------------

def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true",
                    help="CPU, tiny model, 2 gloo processes, Ray-free and through Ray")
    ap.add_argument("--sizes", default="0.6b,1.7b", help="model widths on GPU (0.6b, 1.7b)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="configurations in the order to measure them (names of CONFIGS or "
                         "of --add-config)")
    ap.add_argument("--add-config", action="append", default=[], metavar="NAME=JSON",
                    help="a configuration of your own: overrides by config section, e.g. "
                         "'b64={\"data\": {\"batch_size\": 64}}' (name it in --configs)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", default="4,16,32",
                    help="clips per micro-step (all GPUs); a list sweeps the plain configuration "
                         "over each size the plan says fits (MFU at the best batch)")
    ap.add_argument("--seconds", type=float, default=10.0, help="audio per clip")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="seconds the whole proof may take (0: no limit): a configuration is "
                         "started only if its estimate fits in what is left, and one still "
                         "running at the limit is stopped (the default fits one 10-minute "
                         "command)")
    ap.add_argument("--out", default=None,
                    help="folder for the rows as they finish (gpu_proof.jsonl, gpu_proof.txt)")
    ap.add_argument("--ray", action="store_true", help="also run the plain config through Ray")
    ap.add_argument("--no-ray", action="store_true", help="--tiny without the Ray run")
    ap.add_argument("--no-reinforce", action="store_true",
                    help="without the reinforce stage's row (rollouts/s, update step time)")
    ap.add_argument("--json", default=None, help="also write the rows here at the end")
    ap.add_argument("--cache", default=None, help="folder for the random-weight models")
    return ap.parse_args(argv)


def _measure_size(label: str, size: str | None, names: list[str], env: dict[str, Any]) -> None:
    """Every configuration of one size, in order, while the budget lasts."""
    from engine.config.train import TrainConfig
    from engine.train.resolve import worker_threads

    args, budget, log = env["args"], env["budget"], env["log"]
    configs, use_gpu, worlds = env["configs"], env["use_gpu"], env["worlds"]
    batches = env["batches"]
    if budget.left() <= 0:
        for world in worlds:
            for name in names:
                log.add({"config": name, "gpus": world, "size": label,
                         "skipped": "the time budget is spent"})
        return
    model_dir = make_model_dir(env["cache"] / (label if size else "tiny"), size)
    budget.weights[label] = float(sum(f.stat().st_size for f in model_dir.glob("*.safetensors")))
    base = TrainConfig().replace(
        data={"batch_size": batches[0]}, optim={"lr": 1e-4 if size else 1e-3, "warmup_steps": 1},
        parallel={"use_gpu": use_gpu, "precision": "auto"})
    size_configs = {n: configs[n] for n in names}
    if "plain" in names and use_gpu:
        sweep = _sweep(model_dir, base, batches[1:], max(worlds), args)
        # the larger batches right after plain: MFU at the best batch is the size's figure
        order = list(size_configs)
        at = order.index("plain") + 1
        order[at:at] = list(sweep)
        size_configs = {n: {**size_configs, **sweep}[n] for n in order}
    job = {"use_gpu": use_gpu, "configs": {}, "base_config": base.to_dict(),
           "steps": args.steps, "seconds": args.seconds, "model_dir": str(model_dir),
           "out": str(env["work"]), "size_label": label,
           # checkpoints of 1.7B with optimizer state are ~19 GB: resume is proved
           # on the smaller sizes and on LoRA (small checkpoints)
           "resume_configs": (["plain", "lora"] if size != "1.7b" else ["lora"])}
    for world in worlds:
        for name, overrides in size_configs.items():
            if not budget.may_start(label, name):
                log.add({"config": name, "gpus": world, "size": label,
                         "skipped": f"{max(budget.left(), 0):.0f} s of the time budget left, "
                                    f"~{budget.estimate(label, name):.0f} s needed"})
                continue
            cfg_overrides = {k: v for k, v in overrides.items() if k != "builder"}
            cfg = base.replace(**cfg_overrides) if cfg_overrides else base
            # as the product sets them: under CPU offload AdamW runs on the host's cores
            threads = worker_threads(use_gpu, cfg.parallel.cpu_offload, world,
                                     os.cpu_count() or 1)
            if threads is not None:
                overrides = {**overrides, "parallel": {**overrides.get("parallel", {}),
                                                       "cpu_threads_per_worker": threads}}
            job["configs"] = {name: overrides}
            began = time.monotonic()
            outcome = run_config(job, name, world, budget.deadline)
            took = time.monotonic() - began
            budget.record(label, name, took)
            if "ranks" in outcome:
                flops = cfg.data.grad_accum * model_flops(model_dir, cfg.data.batch_size,
                                                          args.seconds, cfg.model.trainable,
                                                          cfg.model.predictor_frames)
                row = summarise(name, world, outcome["ranks"], job,
                                plan_bytes(model_dir, cfg, world, job), flops, env["peak"])
            else:
                row = {"config": name, "gpus": world, "size": label, **outcome}
            row.update(wall_s=round(took, 1), threads=threads or cfg.parallel.
                       cpu_threads_per_worker)
            log.add(row)
    if (args.tiny or args.ray) and not args.no_ray:
        _ray_row(job, label, max(worlds), env)


def _ray_row(job: dict[str, Any], label: str, world: int, env: dict[str, Any]) -> None:
    """The plain configuration through Ray Train, against the Ray-free run's final loss."""
    budget, log = env["budget"], env["log"]
    row: dict[str, Any] = {"config": "plain via Ray", "gpus": world, "size": label}
    if not budget.may_start(label, "plain via Ray"):
        log.add({**row, "skipped": "the time budget is spent"})
        return
    began = time.monotonic()
    try:
        ray_losses = run_ray(job, world)
        ref = next((r for r in log.rows if r["config"] == "plain" and r["gpus"] == world
                    and r["size"] == label), {})
        row.update(ray_losses=ray_losses, ray_equal=ray_losses[-1:] == [ref.get("final_loss")])
    except ImportError as exc:
        row["error"] = f"Ray is not installed ({exc.name})"
    except Exception as exc:  # the rows so far stay; this one says what went wrong
        row["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
    took = time.monotonic() - began
    budget.record(label, "plain via Ray", took)
    log.add({**row, "wall_s": round(took, 1)})


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = _args(argv)
    missing = check_environment()
    if missing:
        print(missing)
        return 2

    import torch

    # NVML-based count where torch has it: no CUDA context in this process
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not args.tiny and gpus == 0:
        print("gpu_proof: no NVIDIA GPU visible (torch.cuda.is_available() is False); nothing "
              "to prove here (use --tiny for the CPU run of the same path).")
        return 0
    from engine.train.process_env import process_env

    configs = {**CONFIGS, **_added_configs(args.add_config)}
    names = [k for k in args.configs.split(",") if k]
    unknown = [n for n in names if n not in configs]
    if unknown:
        print(f"gpu_proof: unknown configuration {', '.join(unknown)}; use names from "
              f"{', '.join(CONFIGS)} or define one with --add-config NAME=JSON.")
        return 2
    sizes = [s for s in args.sizes.split(",") if s]
    if not args.tiny and [s for s in sizes if s not in SIZES]:
        print(f"gpu_proof: unknown size in {args.sizes!r}; use {', '.join(SIZES)}.")
        return 2
    # the children inherit it: sockets on loopback, GPUs numbered as NVML numbers them
    os.environ.update(process_env(local=True))
    work = Path(tempfile.mkdtemp(prefix="gpu-proof-"))
    name = gpu_name() if gpus else None
    batches = [int(b) for b in str(args.batch).split(",") if b]
    env: dict[str, Any] = {
        "args": args, "budget": Budget(args.budget_s, started),
        "log": RowLog(Path(args.out) if args.out else None), "configs": configs,
        "use_gpu": bool(gpus) and not args.tiny, "work": work, "peak": peak_flops(name),
        "cache": Path(args.cache) if args.cache else Path(tempfile.gettempdir()) / "voxshard-proof",
        "worlds": [2] if args.tiny else [1] + ([2] if gpus >= 2 else []), "batches": batches}
    print(f"gpu_proof: torch {torch.__version__}, {name or 'CPU'}, {args.steps} steps, time "
          f"budget {args.budget_s:.0f} s" + (" (none)" if args.budget_s <= 0 else ""), flush=True)
    try:
        if args.tiny:
            names = [n for n in names if n not in GPU_ONLY]
            args.seconds = min(args.seconds, 2.0)
            env["batches"] = [max(2, min(batches[0], 4))]
            _measure_size("tiny", None, names, env)
            reinforce_row("tiny", None, env)
        else:
            for i, size in enumerate(sizes):
                _measure_size(size, size, size_order(names, size), env)
                if i == 0:  # the stage's figures at the first size, before the larger ones
                    reinforce_row(size, size, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = env["log"].rows
    print(f"wall {time.monotonic() - started:.0f} s")
    out = {"rows": rows, "device": name or "cpu", "gpus": gpus, "torch": torch.__version__}
    print(json.dumps(out, default=float))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
    failed = [r for r in rows if "error" in r and "not installed" not in r["error"]]
    bad = [r for r in rows if r.get("resume_equal") is False or r.get("ray_equal") is False]
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
