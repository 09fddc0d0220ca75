"""Training benchmark: what FSDP sharding saves, and what our step costs.

    python bench/bench_train.py [--layers 28] [--workers 1,2] [--steps 3]

Prints, side by side, on a model built from the real 0.6B configuration
(random weights; fewer talker layers with --layers when memory is short):
- per-rank model-state bytes (parameters + gradients + AdamW state), counted
  from the local DTensor shards of real Ray Train runs with 1 and 2 workers,
  next to the unsharded figure of one process;
- step time and tokens/s of our step (FSDP under Ray Train) against one
  process running the upstream recipe's structure (no sharding, AdamW over
  every parameter, same corrected loss, same batch, fp32 on CPU), given the
  same cores;
- time from launch (`fit()` called) to the first metric on the driver;
- the memory plan's prediction next to the measured state.

Batches are synthetic (random codes in the real layout, fixed seed): the
weights are random too, so real speech would add nothing to the timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")

GIB = float(1 << 30)

#: the real 0.6B-Base talker and code predictor (qwen3-tts-facts.md)
REAL_06B = {
    "talker": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
               "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
               "text_hidden_size": 2048, "text_vocab_size": 151936},
    "code_predictor": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                       "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
}


def make_model_dir(out: Path, layers: int) -> Path:
    """A model folder with the 0.6B configuration and random talker weights."""
    if (out / "model.safetensors").exists():
        return out
    import torch
    from safetensors.torch import save_file

    from engine.model.tiny import make_tiny_model
    from engine.train.objective import build_talker

    tiny = out.parent / "tiny-template"
    if not (tiny / "config.json").exists():
        tiny = make_tiny_model(tiny, seed=0)
    cfg = json.loads((tiny / "config.json").read_text())
    talker = cfg["talker_config"]
    talker.update(REAL_06B["talker"], num_hidden_layers=layers)
    # 3-axis interleaved MRoPE sections must sum to head_dim / 2 (the real split)
    talker.setdefault("rope_scaling", {})
    if isinstance(talker["rope_scaling"], dict):
        talker["rope_scaling"]["mrope_section"] = [24, 20, 20]
    talker["code_predictor_config"].update(REAL_06B["code_predictor"])
    for sub in (talker, talker["code_predictor_config"]):
        if "layer_types" in sub:  # one entry per layer
            sub["layer_types"] = ["full_attention"] * int(sub["num_hidden_layers"])
    cfg["speaker_encoder_config"]["enc_dim"] = talker["hidden_size"]
    cfg["tts_model_size"] = f"0.6b-{layers}l"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(0)
    model = build_talker(out, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    sd = {f"talker.{k}": v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(out / "model.safetensors"))
    return out


def synthetic_batches(model_dir: Path, clips: int, seconds: float, seed: int) -> list[dict]:
    """`clips` sequences of `seconds` of audio and a sentence of text, collated one per clip."""
    import numpy as np

    from engine.data.layout import LayoutIds, build_sequence, collate

    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    rng = np.random.default_rng(seed)
    frames = int(seconds * 12.5)
    hidden = cfg["talker_config"]["hidden_size"]
    vocab = cfg["talker_config"]["text_vocab_size"]
    out = []
    for _ in range(clips):
        text = rng.integers(10, min(vocab, 1000), size=int(seconds * 3)).tolist()
        codes = rng.integers(0, 2048, size=(frames, 16))
        seq = build_sequence(ids, [1, 2, 3], text, codes)
        batch = collate([seq], ids)
        batch["x_vector"] = rng.standard_normal((1, hidden)).astype("float32") * 0.02
        out.append(batch)
    return out


def bench_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """Ray worker builder: the product's objective + parallelize, synthetic data."""
    import torch

    from engine.train.objective import batch_to_device, build_objective, load_base_weights
    from engine.train.parallelize import make_mesh, parallelize, set_gradient_sync
    from engine.train.worker import TrainParts

    model_dir = Path(loop_config["model_dir"])
    device = torch.device("cpu")
    objective = build_objective(model_dir, cfg.model, device="meta")
    parallelize(objective, make_mesh(device), cfg.parallel, device)
    load_base_weights(objective, model_dir, device)
    clips = int(loop_config["bench_clips"])
    batches = synthetic_batches(model_dir, clips, float(loop_config["bench_seconds"]), seed=1)
    mine = batches[rank::world]
    total_targets = sum(float(b["target_mask"].sum()) for b in batches)
    total_sub = sum(float(b["frame_mask"].sum()) * 15 for b in batches)

    def forward(model: Any, batch: Any) -> dict[str, Any]:
        b = batch_to_device(batch, device)
        # whole-step normalisers, as the dataset provides them
        b["talker_norm"] = torch.tensor(total_targets)
        b["subtalker_norm"] = torch.tensor(total_sub)
        return model(b)

    return TrainParts(model=objective, device=device, steps_per_epoch=1_000_000,
                      step_batches=lambda epoch, pos: mine, forward=forward,
                      subtalker_weight=cfg.model.subtalker_weight,
                      set_grad_sync=lambda on: set_gradient_sync(objective, on))


def run_ours(model_dir: Path, workers: int, steps: int, clips: int, seconds: float,
             run_root: Path) -> dict[str, Any]:
    from engine.cluster import connect
    from engine.events import Emitter
    from engine.train.config import TrainConfig
    from engine.train.launch import Launch, LaunchSpec

    cfg = TrainConfig().replace(
        model={"base": str(model_dir)},
        # the same cores as the single-process baseline: split between the workers
        parallel={"workers": workers,
                  "cpu_threads_per_worker": max(1, (os.cpu_count() or 1) // workers)},
        data={"batch_size": max(clips, workers)},
        optim={"lr": 1e-5, "warmup_steps": 0},
        run={"steps": steps, "checkpoint_every": 10_000, "val_every": 0})
    cluster = connect(num_cpus=max(os.cpu_count() or 1, workers), on_event=Emitter())
    try:
        run_dir = run_root / f"bench-{workers}w-{int(time.time())}"
        spec = LaunchSpec(config=cfg.to_dict(), run_dir=run_dir, total_steps=steps,
                          workers=workers, use_gpu=False,
                          cpus_per_worker=max(1, (os.cpu_count() or 1) // workers),
                          builder="bench.bench_train:bench_builder",
                          extra={"model_dir": str(model_dir), "bench_clips": clips,
                                 "bench_seconds": seconds})
        launch = Launch(spec, Emitter()).start()
        result = launch.wait()
    finally:
        cluster.close()
    train = [r for r in result.records if r["kind"] == "train"]
    by_rank: dict[int, list[dict]] = {}
    for r in train:
        by_rank.setdefault(int(r["rank"]), []).append(r["values"])
    rank0 = by_rank[0]
    first = rank0[0]
    later = [v["perf/step_s"] for v in rank0[1:]] or [first["perf/step_s"]]
    tokens = [v["perf/tokens"] for v in rank0]
    state = {r: vals[0] for r, vals in by_rank.items()}
    return {
        "workers": workers,
        "state": {r: {k: v[f"memory/state_{k}_gib"] for k in ("params", "grads", "optimizer")}
                  for r, v in state.items()},
        "peak_rss_gib": {r: max(x.get("memory/peak_gib", 0.0) for x in vals)
                         for r, vals in by_rank.items()},
        "step_s": sum(later) / len(later),
        "tokens_per_s": tokens[-1] / (sum(later) / len(later)),
        "launch_to_first_metric_s": result.launch_to_first_metric_s,
        "build_s": first.get("perf/build_s"),
        "losses": [v["loss/train"] for v in rank0],
    }


def upstream_step(model_dir: str, steps: int, clips: int, seconds: float,
                  threads: int) -> dict[str, Any]:
    """One process, upstream structure: no sharding, AdamW over every parameter."""
    import resource

    import torch

    from engine.train.metrics import model_state_bytes
    from engine.train.objective import batch_to_device, build_objective, load_base_weights

    torch.set_num_threads(threads)
    md = Path(model_dir)
    objective = build_objective(md, None, device="cpu")
    load_base_weights(objective, md, "cpu")
    for p in objective.parameters():
        p.requires_grad_(True)  # upstream optimizes model.parameters(): everything
    opt = torch.optim.AdamW(objective.parameters(), lr=1e-5)
    batches = synthetic_batches(md, clips, seconds, seed=1)
    total_targets = sum(float(b["target_mask"].sum()) for b in batches)
    total_sub = sum(float(b["frame_mask"].sum()) * 15 for b in batches)
    times, losses, state = [], [], None
    for _ in range(steps):
        t0 = time.monotonic()
        for b in batches:
            bt = batch_to_device(b, "cpu")
            bt["talker_norm"] = torch.tensor(total_targets)
            bt["subtalker_norm"] = torch.tensor(total_sub)
            out = objective(bt)
            out["loss"].backward()
            losses.append(float(out["loss"]))
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        opt.step()
        if state is None:
            state = model_state_bytes(objective, opt)
        opt.zero_grad(set_to_none=True)
        times.append(time.monotonic() - t0)
    later = times[1:] or times
    step_s = sum(later) / len(later)
    return {"step_s": step_s, "tokens_per_s": total_targets / step_s,
            "state": {k: state[k] / GIB for k in ("params", "grads", "optimizer")},
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}


def unsharded_trainable_state(model_dir: Path) -> dict[str, float]:
    """One process, our trainable set, unsharded: counted on the meta device."""
    from engine.train.objective import build_objective

    obj = build_objective(model_dir, None, device="meta")
    total = sum(p.numel() for p in obj.parameters())
    trainable = sum(p.numel() for p in obj.parameters() if p.requires_grad)
    return {"params": 4 * total / GIB, "grads": 4 * trainable / GIB,
            "optimizer": 8 * trainable / GIB, "n_params": total, "n_trainable": trainable}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28, help="talker layers (real: 28)")
    ap.add_argument("--workers", default="1,2", help="worker counts to run")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    ap.add_argument("--clips", type=int, default=2, help="clips per step (global batch)")
    ap.add_argument("--seconds", type=float, default=6.0, help="audio seconds per clip")
    ap.add_argument("--work", default="/tmp/voxshard-bench", help="scratch folder")
    ap.add_argument("--skip-upstream", action="store_true")
    ap.add_argument("--upstream-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work)
    model_dir = make_model_dir(work / f"model-0.6b-{args.layers}l", args.layers)
    threads = os.cpu_count() or 1
    if args.upstream_only:
        print(json.dumps(upstream_step(str(model_dir), args.steps, args.clips, args.seconds,
                                       threads)))
        return

    unsharded = unsharded_trainable_state(model_dir)
    upstream = None
    if not args.skip_upstream:
        # its own process: its ~all-parameter AdamW state must be gone before Ray starts
        proc = subprocess.run([sys.executable, __file__, "--upstream-only", "--layers",
                               str(args.layers), "--steps", str(args.steps), "--clips",
                               str(args.clips), "--seconds", str(args.seconds), "--work",
                               str(work)], capture_output=True, text=True, check=True)
        upstream = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = {}
    for w in (int(x) for x in args.workers.split(",")):
        ours[w] = run_ours(model_dir, w, args.steps, args.clips, args.seconds, work / "runs")

    from engine.train.config import TrainConfig
    from engine.train.plan import make_plan

    print(f"\nModel: 0.6B configuration, {args.layers} talker layers, random weights, fp32 on "
          f"CPU ({threads} cores); {unsharded['n_params'] / 1e6:,.1f}M parameters, "
          f"{unsharded['n_trainable'] / 1e6:,.1f}M trainable (text embedding frozen).")
    print(f"Batch: {args.clips} clips x {args.seconds:g} s per optimizer step; "
          f"{args.steps} steps per run (first excluded from timings).\n")
    cols = ["unsharded (1 proc)"] + [f"FSDP {w}w rank {r}" for w in ours
                                     for r in sorted(ours[w]["state"])]
    print("Per-rank model state, GiB  " + "".join(f"{c:>20}" for c in cols))
    for key in ("params", "grads", "optimizer"):
        row = [unsharded[key]] + [ours[w]["state"][r][key] for w in ours
                                  for r in sorted(ours[w]["state"])]
        print(f"  {key:<25}" + "".join(f"{v:20.3f}" for v in row))
    tot = [unsharded["params"] + unsharded["grads"] + unsharded["optimizer"]]
    tot += [sum(ours[w]["state"][r].values()) for w in ours for r in sorted(ours[w]["state"])]
    print(f"  {'total':<25}" + "".join(f"{v:20.3f}" for v in tot))
    for w in ours:
        plan = make_plan(model_dir, TrainConfig().replace(
            model={"base": str(model_dir)}, parallel={"workers": w},
            data={"batch_size": max(args.clips, w)}), device="cpu", free=[1 << 45],
            seq_len=int(args.seconds * 12.5 + args.seconds * 3 + 11),
            frames=int(args.seconds * 12.5))
        meas = sum(ours[w]["state"][0].values())
        print(f"  plan, {w} worker(s), rank 0: {plan.model_state / GIB:.3f} GiB predicted vs "
              f"{meas:.3f} measured; peak RSS per rank "
              + ", ".join(f"{v:.2f}" for v in ours[w]["peak_rss_gib"].values())
              + f" GiB (plan total {plan.total / GIB:.2f})")

    print("\nStep                        step s    tokens/s   launch->1st metric s   "
          "build s   peak RSS GiB")
    if upstream:
        print(f"  upstream structure, 1 proc {upstream['step_s']:8.2f} "
              f"{upstream['tokens_per_s']:10.1f} {'-':>22} {'-':>9} "
              f"{upstream['peak_rss_gib']:13.2f}")
        up_state = sum(upstream["state"].values())
        print(f"    (its model state: {up_state:.3f} GiB: AdamW over every parameter)")
    for w, o in ours.items():
        print(f"  ours, FSDP {w} worker(s)     {o['step_s']:8.2f} {o['tokens_per_s']:10.1f} "
              f"{o['launch_to_first_metric_s']:22.1f} {o['build_s']:9.1f} "
              f"{max(o['peak_rss_gib'].values()):13.2f}")
        print(f"    losses: {', '.join(f'{x:.4f}' for x in o['losses'])}")


if __name__ == "__main__":
    main()
