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

    python bench/bench_train.py --mixed [--layers 4] [--clips 32] [--batch 4]
                                        [--device cuda]

`--mixed`: clips of 1-15 s spread as in a real voice (log-normal around 5 s),
one epoch of them, single process on each side, the same threads:
- ours: the product's epoch order (`engine.data.dataset.epoch_batches`:
  length-bucketed micro-batches in random order), the worker loop
  (`run_worker`: FSDP over one rank, AdamW over the trainable parameters,
  gather rows built on the host, prefetch thread), torch.distributed without
  Ray;
- upstream structure: random order, batches padded to their longest clip,
  AdamW over every parameter, each micro-batch collated on the main thread.
Equal work on both sides: each first trains one warm-up step on the same clips
(the first `batch x accum` of the list, collated alike; not timed), then the
whole epoch is timed, every step of it. Useful tokens/s: talker targets
(frames) of the epoch over that time. `--repeats R` runs both sides R times
and prints the ratio's spread. `--predictor-frames` (default 1,0.25,0.125,0.0625)
runs ours at each F (the code predictor on that share of each step's frames,
`engine.data.frames`), side by side in one table with the upstream run of the
same repeat.
`--split` then times the talker pass and the code-predictor pass of 4
bucketed micro-batches apart (forward + backward). `--device cuda` runs both
on the first GPU in bf16.

    python bench/bench_train.py --converge [--converge-steps 120] [--repeats 2]

`--converge`: the tiny model fine-tuned on the 12-take demo corpus the tests
use (piper's 'joe' reading tests/helpers/speech.py's SENTENCES; 3 takes held
out) through the product's worker loop and builder, `--converge-steps` steps at
each F, one run per seed (`--repeats`: the data seed, which takes are held out
and the batch order, and the run seed, the frame draws). Prints the held-out
loss on every frame at equal steps and at equal training time (the quickest
F's time for those steps: each F's last validation within it).
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
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401
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

    from engine.train.builder import TrainParts
    from engine.train.objective import batch_to_device, build_objective, load_base_weights
    from engine.train.parallelize import make_mesh, parallelize, set_gradient_sync

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
    from engine.config.train import TrainConfig
    from engine.core.events import Emitter
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


# -- --mixed: real clip-length spread, bucketed order against upstream's padded batches ------

def mixed_durations(n: int, seed: int = 3) -> list[float]:
    """Clip lengths of a real voice: log-normal around 5 s, within 1-15 s."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [float(x) for x in np.clip(rng.lognormal(np.log(5.0), 0.6, size=n), 1.0, 15.0)]


def mixed_clips(model_dir: Path, durations: list[float], seed: int = 1) -> list[Any]:
    """One ClipSequence per duration (random codes, ~3 text tokens per second)."""
    import numpy as np

    from engine.data.layout import LayoutIds, build_sequence

    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    rng = np.random.default_rng(seed)
    vocab = int(cfg["talker_config"]["text_vocab_size"])
    return [build_sequence(ids, [1, 2, 3],
                           rng.integers(10, min(vocab, 1000), size=max(2, int(d * 3))).tolist(),
                           rng.integers(0, 2048, size=(max(2, int(d * 12.5)), 16)))
            for d in durations]


def _collate_step(model_dir: Path, seqs: list[Any], groups: list[list[int]],
                  fraction: float = 1.0, step: int = 0) -> list[dict]:
    """Collated micro-batches of one optimizer step with its loss normalisers; with
    `fraction` below 1 the code predictor's frame picks of the step (run seed 0)."""
    import numpy as np

    from engine.data.frames import PredictorSample, rank_picks
    from engine.data.layout import NUM_CODEBOOKS, LayoutIds, collate, count_tokens
    from engine.train.loss import normalisers

    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    hidden = int(cfg["talker_config"]["hidden_size"])
    t, s = count_tokens([seqs[i] for g in groups for i in g])
    norm = normalisers(t, s, 1)
    out = []
    for g in groups:
        b = collate([seqs[i] for i in g], ids)
        b["x_vector"] = (np.random.default_rng(g).standard_normal((len(g), hidden))
                         .astype("float32") * 0.02)
        b["talker_norm"], b["subtalker_norm"] = norm
        out.append(b)
    if fraction < 1:
        blocks = np.array([[int(b["frame_mask"].sum())] for b in out])
        picks, sampled = rank_picks(blocks, PredictorSample(fraction, 0), step, 0)
        for b, pick in zip(out, picks, strict=True):
            b["predictor_pick"] = pick
            b["subtalker_norm"] = float(sampled * (NUM_CODEBOOKS - 1))
    return out


def warmup_groups(batch: int, accum: int) -> list[list[int]]:
    """The warm-up step both sides train first (not timed): the list's first clips."""
    return [list(range(m * batch, (m + 1) * batch)) for m in range(accum)]


def mixed_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """Ours on mixed clips: the product's bucketed epoch order, synthetic clips."""
    from engine.data.dataset import epoch_batches
    from engine.train.builder import TrainParts, sharded_objective
    from engine.train.objective import batch_to_device
    from engine.train.parallelize import set_gradient_sync, set_keep_gathered

    model_dir = Path(loop_config["model_dir"])
    objective, device, precision, _ = sharded_objective(cfg, loop_config, model_dir)
    seqs = mixed_clips(model_dir, loop_config["durations"])
    accum = cfg.data.grad_accum
    order = epoch_batches([s.length for s in seqs], cfg.data.batch_size, accum,
                          cfg.data.bucket_batches, seed=0, epoch=0)

    fraction = float(cfg.model.predictor_frames)

    def step_batches(epoch: int, position: int) -> list[Any]:
        # position 0: the warm-up step upstream trains too; then the epoch, in order
        if position == 0:
            return _collate_step(model_dir, seqs, warmup_groups(cfg.data.batch_size, accum),
                                 fraction, 0)
        k = (position - 1) % (len(order) // accum)
        return _collate_step(model_dir, seqs, order[k * accum:(k + 1) * accum], fraction,
                             position)

    return TrainParts(model=objective, device=device, steps_per_epoch=1 + len(order) // accum,
                      step_batches=step_batches,
                      forward=lambda m, b: m(batch_to_device(b, device)),
                      set_grad_sync=lambda on: set_gradient_sync(objective, on),
                      set_keep_gathered=lambda keep, last: set_keep_gathered(objective, keep,
                                                                             last),
                      precision=precision,
                      prepare=lambda b: batch_to_device(b, device, pin=True))


def ours_mixed(model_dir: Path, durations: list[float], batch: int, accum: int,
               device: str, fraction: float = 1.0, keep: str = "auto") -> dict[str, Any]:
    """The product's worker loop on one rank, torch.distributed without Ray; "auto"
    settings resolved by the memory plan, as the driver resolves them."""
    import socket

    import torch
    import torch.distributed as dist

    from engine.config.train import TrainConfig
    from engine.train.parallelize import process_group_backend
    from engine.train.plan import make_plan
    from engine.train.run import resolved
    from engine.train.trainer import WorkerEnv, run_worker

    use_gpu = device == "cuda"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    dist.init_process_group(process_group_backend(use_gpu), rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{port}")
    steps = len(durations) // (batch * accum)
    cfg = TrainConfig().replace(
        model={"base": str(model_dir), "predictor_frames": fraction},
        data={"batch_size": batch, "grad_accum": accum},
        parallel={"workers": 1, "use_gpu": use_gpu, "precision": "auto",
                  "cpu_threads_per_worker": torch.get_num_threads(), "keep_gathered": keep},
        optim={"lr": 1e-5, "warmup_steps": 0}, run={"val_every": 0})
    seqs = mixed_clips(model_dir, durations)
    plan = make_plan(model_dir, cfg, device=device, choices=False,
                     seq_len=max(s.length for s in seqs),
                     frames=max(int(s.frame_mask.sum()) for s in seqs))
    cfg = resolved(cfg, plan)

    import tempfile

    from engine.train.trainer import ListSender

    sender = ListSender()

    try:
        run_worker({"config": cfg.to_dict(), "run_dir": tempfile.mkdtemp(prefix="mixed-"),
                    "total_steps": 1 + steps, "builder": "bench.bench_train:mixed_builder",
                    "model_dir": str(model_dir), "durations": durations,
                    "save_final": False}, WorkerEnv(rank=0, world=1, sender=sender))
    finally:
        dist.destroy_process_group()
    train = sender.of("train")
    epoch = train[1:]  # the warm-up step is not timed; the whole epoch is
    secs = sum(v["perf/step_s"] for v in epoch)
    tokens = sum(v["perf/tokens"] for v in epoch)
    return {"steps": steps, "step_s": secs / len(epoch), "tokens_per_s": tokens / secs,
            "epoch_s": secs, "tokens": tokens, "losses": [v["loss/train"] for v in train],
            "keep_gathered": cfg.parallel.keep_gathered,
            "plan_gib": round(plan.total / GIB, 2)}


def upstream_mixed(model_dir: Path, durations: list[float], batch: int, accum: int,
                   device: str) -> dict[str, Any]:
    """Upstream's structure on the same clips: random batches padded to the longest clip,
    AdamW over every parameter, collation on the main thread."""
    import contextlib

    import numpy as np
    import torch

    from engine.train.objective import batch_to_device, build_objective, load_base_weights

    objective = build_objective(model_dir, None, device="cpu")
    load_base_weights(objective, model_dir, "cpu")
    objective.to(device)
    for p in objective.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(objective.parameters(), lr=1e-5)
    seqs = mixed_clips(model_dir, durations)
    perm = np.random.default_rng(0).permutation(len(seqs)).tolist()
    per_step = batch * accum
    steps = len(seqs) // per_step
    amp = (torch.autocast("cuda", torch.bfloat16) if device == "cuda"
           else contextlib.nullcontext())
    times, tokens = [], []
    for k in range(1 + steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.monotonic()
        # step 0: the warm-up both sides train (not timed); then the epoch, random order
        ids = perm[(k - 1) * per_step:k * per_step]
        groups = (warmup_groups(batch, accum) if k == 0
                  else [ids[m * batch:(m + 1) * batch] for m in range(accum)])
        done = 0.0
        for b in _collate_step(model_dir, seqs, groups):
            with amp:
                out = objective(batch_to_device(b, device))
            (out["loss"] / accum).backward()
            done += float(out["talker_tokens"])
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.monotonic() - t0)
        tokens.append(done)
    secs = sum(times[1:])
    return {"steps": steps, "step_s": secs / steps, "tokens_per_s": sum(tokens[1:]) / secs,
            "epoch_s": secs, "tokens": sum(tokens[1:])}


def padding_share(durations: list[float], batch: int, bucketed: bool) -> float:
    """Fraction of a step's sequence positions that are padding, in one or the other order."""
    import numpy as np

    from engine.data.dataset import epoch_batches

    lengths = [int(d * 12.5) + int(d * 3) + 11 for d in durations]
    if bucketed:
        groups = epoch_batches(lengths, batch, 1, 16, seed=0, epoch=0)
    else:
        perm = np.random.default_rng(0).permutation(len(lengths)).tolist()
        groups = [perm[i:i + batch] for i in range(0, len(perm) - batch + 1, batch)]
    real = sum(lengths[i] for g in groups for i in g)
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    return 1.0 - real / padded


def mixed_split(model_dir: Path, durations: list[float], batch: int,
                micro_batches: int = 4) -> dict[str, float]:
    """Where a step's time goes: forward + backward of the whole objective against its
    talker pass alone and its code-predictor pass alone (the talker's hidden states
    computed without gradients and fed in), on the first bucketed micro-batches."""
    import torch

    from engine.data.dataset import epoch_batches
    from engine.train import loss as L
    from engine.train.objective import (
        batch_to_device,
        build_objective,
        load_base_weights,
        set_trainable,
    )

    objective = build_objective(model_dir, None, device="cpu")
    load_base_weights(objective, model_dir, "cpu")
    set_trainable(objective, "talker")
    seqs = mixed_clips(model_dir, durations)
    order = epoch_batches([s.length for s in seqs], batch, 1, 16, seed=0, epoch=0)
    batches = [batch_to_device(_collate_step(model_dir, seqs, [g])[0], "cpu")
               for g in order[:micro_batches]]

    def whole(b: dict) -> None:
        objective(b)["loss"].backward()

    def talker(b: dict) -> None:
        objective.talker_hidden(objective.embed(b)).float().pow(2).mean().backward()

    def predictor(b: dict) -> None:
        with torch.no_grad():
            hidden = objective.talker_hidden(objective.embed(b))
        prev, codes = L.frame_inputs(hidden, b["codec_ids"], b["sub_codes"], b["frame_mask"],
                                     b.get("frame_rows"))
        prev = prev.detach().requires_grad_(True)
        total, n = L.subtalker_ce(objective.subtalker_logits(prev, codes), codes,
                                  b.get("subtalker_count"))
        (total / n).backward()

    out = {"frames": float(sum(int(b["frame_mask"].sum()) for b in batches))}
    for label, fn in (("whole", whole), ("talker", talker), ("predictor", predictor)):
        took = 0.0
        for b in batches:
            t0 = time.perf_counter()
            fn(b)
            took += time.perf_counter() - t0
            objective.zero_grad(set_to_none=True)
        out[label] = took
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _fraction(f: float) -> str:
    """F as the issue writes it: 1, 1/4, 1/8, 1/16 (others as decimals)."""
    inverse = 1 / f
    return "1" if f == 1 else f"1/{inverse:.0f}" if abs(inverse - round(inverse)) < 1e-9 \
        else f"{f:g}"


def mixed_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Each side's mean s/step and useful tokens/s over the repeats, and ours over upstream
    (each repeat's own upstream run) with its spread."""
    lines = [f"  {'side':<24}{'steps':>6}{'s/step':>9}{'useful tok/s':>14}"
             f"{'vs upstream':>13}  spread over repeats"]
    for side, rs in runs.items():
        ratios = [o["tokens_per_s"] / u["tokens_per_s"]
                  for o, u in zip(rs, runs["upstream"], strict=True)]
        spread = (f"{min(ratios):.2f}-{max(ratios):.2f} ({len(ratios)})"
                  if side != "upstream" and len(ratios) > 1 else "-")
        label = side
        if side != "upstream":
            f, _, keep = side[7:].partition(" ")
            label = f"ours F={_fraction(float(f))}" + (f" {keep}" if keep else "")
        lines.append(f"  {label:<24}{rs[0]['steps']:>6}{_mean([r['step_s'] for r in rs]):>9.2f}"
                     f"{_mean([r['tokens_per_s'] for r in rs]):>14.1f}"
                     f"{_mean(ratios):>12.2f}x  {spread}")
    return "\n".join(lines)


def main_mixed(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(args.work)
    model_dir = make_model_dir(work / f"model-0.6b-{args.layers}l", args.layers)
    # whole optimizer steps only: both sides then train on exactly the same clips
    durations = mixed_durations(args.clips - args.clips % (args.batch * args.accum))
    fractions = [float(f) for f in str(args.predictor_frames).split(",")]
    if args.side:
        if args.side == "upstream":
            out = upstream_mixed(model_dir, durations, args.batch, args.accum, args.device)
        else:
            out = ours_mixed(model_dir, durations, args.batch, args.accum, args.device,
                             fractions[0], args.keep_gathered.split(",")[0])
        print(json.dumps(out))
        return
    keeps = args.keep_gathered.split(",")
    # ours at each F, and at each --keep-gathered choice after the first (an A/B)
    sides = ["upstream"] + [f"ours F={f:g}" + (f" keep={k}" if k != keeps[0] else "")
                            for f in fractions for k in keeps]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    load_before = os.getloadavg()[0]
    #: each repeat's wall time, and each side's process in it (build, warm-up and epoch)
    costs: list[dict[str, float]] = []
    for rep in range(args.repeats):
        costs.append({})
        for side in sides:  # each in its own process: memory and threads apart
            f, _, keep = side.partition("=")[2].partition(" keep=")
            which = ["--side", "upstream"] if side == "upstream" else [
                "--side", "ours", "--predictor-frames", f,
                "--keep-gathered", keep or keeps[0]]
            t0, load0 = time.monotonic(), os.getloadavg()[0]
            proc = subprocess.run([sys.executable, __file__, "--mixed", *which,
                                   "--layers", str(args.layers), "--clips", str(args.clips),
                                   "--batch", str(args.batch), "--accum", str(args.accum),
                                   "--device", args.device, "--work", str(work)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
                raise SystemExit(f"{side} failed")
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            costs[rep][side] = time.monotonic() - t0
            print(f"repeat {rep + 1} {side}: {costs[rep][side]:.0f} s in all, load "
                  f"{load0:.1f} -> {os.getloadavg()[0]:.1f}: {json.dumps(runs[side][-1])}",
                  flush=True)
    print(f"\nMixed clips: {args.clips} of {min(durations):.1f}-{max(durations):.1f} s "
          f"(median {sorted(durations)[len(durations) // 2]:.1f} s); {args.batch} clips per "
          f"micro-batch x {args.accum}; 0.6B widths, {args.layers} talker layers, "
          f"{args.device}, {os.cpu_count()} threads; load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after.")
    print(f"  padding: {padding_share(durations, args.batch, False):.0%} of positions in "
          f"random batches, {padding_share(durations, args.batch, True):.0%} bucketed")
    print(f"  equal work: one warm-up step on the same clips, then the whole epoch timed; "
          f"{args.repeats} repeat(s)")
    print(mixed_table(runs))
    for rep, cost in enumerate(costs):
        print(f"  repeat {rep + 1} took {sum(cost.values()):.0f} s: "
              + ", ".join(f"{side} {s:.0f} s" for side, s in cost.items())
              + " (each side's process: build, warm-up step, the epoch)")
    if args.split:
        split = mixed_split(model_dir, durations, args.batch)
        print(f"  where a step goes (forward + backward, {int(split['frames'])} frames in 4 "
              f"bucketed micro-batches): whole {split['whole']:.2f} s, talker pass "
              f"{split['talker']:.2f} s ({split['talker'] / split['whole']:.0%}), code "
              f"predictor pass {split['predictor']:.2f} s "
              f"({split['predictor'] / split['whole']:.0%}); bucketing can only shrink "
              f"the talker's share (the predictor runs on real frames on both sides)")


# -- --converge: held-out loss at each F, the tiny model on the demo corpus -------------------

def demo_voice(work: Path, model_dir: Path) -> Path:
    """The 12-take demo corpus the tests train on (tests/helpers/speech.py: piper's 'joe'
    reading SENTENCES), prepared and coded for `model_dir`; built once under `work`."""
    voice = work / "demo-voice" / "joe"
    done = voice.parent / "coded"
    if done.exists():
        return voice
    import shutil

    from engine.data.codes import extract_codes
    from tests.helpers.speech import make_synth, prepare_demo_voice, write_sentences

    shutil.rmtree(voice.parent, ignore_errors=True)
    takes = voice.parent / "takes"
    takes.mkdir(parents=True)
    prepare_demo_voice(voice, write_sentences(takes, make_synth()))
    extract_codes(voice, model_dir)
    done.write_text("")
    return voice


def converge_run(model_dir: Path, voice: Path, fraction: float, steps: int, seed: int,
                 val_every: int, run_dir: Path) -> dict[str, Any]:
    """One fine-tune of the tiny model through the product's worker loop and builder (no
    Ray): held-out loss on every frame each `val_every` steps, with the training time
    (the steps' own time, validation left out) it took to get there. `seed` is the data's
    (which takes are held out, the batch order) and the run's (the frame draws): with the
    run's alone, every F = 1 run was the same run."""
    import torch

    from engine.config.train import TrainConfig
    from engine.train.trainer import ListSender, WorkerEnv, run_worker

    cfg = TrainConfig().replace(
        model={"base": str(model_dir), "predictor_frames": fraction},
        data={"batch_size": 2, "val_fraction": 0.25, "seed": seed},
        optim={"lr": 1e-3, "warmup_steps": 0},
        parallel={"cpu_threads_per_worker": torch.get_num_threads()},
        run={"val_every": val_every, "checkpoint_every": 1 << 30, "seed": seed})
    sender = ListSender()
    run_worker({"config": cfg.to_dict(), "run_dir": str(run_dir), "total_steps": steps,
                "model_dir": str(model_dir), "voice_dir": str(voice), "save_final": False},
               WorkerEnv(rank=0, world=1, sender=sender))
    clock, t = [], 0.0
    for v in sender.of("train"):
        t += v["perf/step_s"]
        clock.append(t)
    return {"fraction": fraction, "seed": seed, "clock": clock,
            "val": [(int(v["step"]), v["loss/val"], v["loss/val_subtalker"])
                    for v in sender.of("val")]}


def at_time(run: dict[str, Any], budget: float) -> tuple[int, float, float] | None:
    """The last validation of `run` whose step ended within `budget` seconds of training."""
    within = [v for v in run["val"] if run["clock"][v[0] - 1] <= budget + 1e-9]
    return within[-1] if within else None


def _mean_range(xs: list[float]) -> str:
    return f"{_mean(xs):.3f}" + (f" ({min(xs):.3f}-{max(xs):.3f})" if len(xs) > 1 else "")


def converge_table(runs: dict[float, list[dict[str, Any]]], steps: int,
                   work: dict[float, float]) -> str:
    """Held-out loss at equal steps, at equal training time (the quickest F's time for
    `steps`) and at equal compute (the plan's `step_work`: the cheapest F's `steps`, a load
    of the machine cannot move it), means over the seeds with their range."""
    budget = min(_mean([r["clock"][-1] for r in rs]) for rs in runs.values())
    cheapest = min(work.values())
    at_steps = f"held-out loss at {steps} steps"
    at_budget = f"at {budget:.1f} s: step"
    lines = [f"  {'F':<6}{'s/step':>8}{'train s':>9}   {at_steps:<28}{'sub-talker part':<24}"
             f"{at_budget + '   held-out loss':<40}{'equal compute: step':>24}   held-out loss"]
    for f, rs in runs.items():
        train_s = [r["clock"][-1] for r in rs]
        final = [r["val"][-1] for r in rs]
        timed = [at_time(r, budget) for r in rs]
        reached = [x for x in timed if x is not None]
        same_time = ("" if len(reached) < len(timed) else
                     f"{_mean([x[0] for x in reached]):>16.0f}   "
                     + _mean_range([x[1] for x in reached]))
        row = (f"{_fraction(f):<6}{_mean(train_s) / steps:>8.3f}{_mean(train_s):>9.1f}   "
               f"{_mean_range([v[1] for v in final]):<28}")
        afford = steps * cheapest / work[f]
        computed = [[v for v in r["val"] if v[0] <= afford + 1e-9] for r in rs]
        same_work = ("-" if not all(computed) else
                     f"{_mean([c[-1][0] for c in computed]):>24.0f}   "
                     + _mean_range([c[-1][1] for c in computed]))
        lines.append(f"  {row}{_mean_range([v[2] for v in final]):<24}"
                     f"{same_time if reached == timed else format('-', '>16'):<40}{same_work}")
    return "\n".join(lines)


def main_converge(args: argparse.Namespace) -> None:
    import tempfile

    import torch

    from engine.model.tiny import make_tiny_model
    from engine.train.plan import step_work, typical_lengths

    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(args.work)
    model_dir = work / "tiny-converge"
    if not (model_dir / "config.json").exists():
        model_dir = make_tiny_model(model_dir, seed=0)
    voice = demo_voice(work, model_dir)
    fractions = [float(f) for f in str(args.predictor_frames).split(",")]
    load_before = os.getloadavg()[0]
    runs: dict[float, list[dict[str, Any]]] = {f: [] for f in fractions}
    for rep in range(args.repeats):
        for f in fractions:
            run = converge_run(model_dir, voice, f, args.converge_steps, rep, args.val_every,
                               Path(tempfile.mkdtemp(prefix="converge-")))
            runs[f].append(run)
            print(f"seed {rep} F={_fraction(f)}: {run['clock'][-1]:.1f} s, held-out "
                  + ", ".join(f"{s}:{v:.3f}" for s, v, _ in run["val"]), flush=True)
    print(f"\nConvergence: the tiny model fine-tuned on the 12-take demo corpus (3 takes "
          f"held out, scored on every frame: talker + sub-talker loss), batch 2, lr 1e-3, "
          f"{args.converge_steps} steps at each F, {args.repeats} seed(s) (mean, range); "
          f"{os.cpu_count()} threads, load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after.")
    cfg = json.loads((model_dir / "config.json").read_text())
    seq_len, frames = typical_lengths(voice, 2048)
    cost = {f: step_work(cfg, seq_len, frames, f) for f in fractions}
    print("  a step's compute at each F (the plan's step_work, the longest clip): "
          + ", ".join(f"{_fraction(f)} {w:.2f}" for f, w in cost.items()))
    print(converge_table(runs, args.converge_steps, cost))
    (work / "converge-runs.json").write_text(json.dumps(
        {"steps": args.converge_steps, "work": cost, "runs": runs}))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28, help="talker layers (real: 28)")
    ap.add_argument("--workers", default="1,2", help="worker counts to run")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    ap.add_argument("--clips", type=int, default=2, help="clips per step (global batch)")
    ap.add_argument("--seconds", type=float, default=6.0, help="audio seconds per clip")
    ap.add_argument("--work", default="/tmp/voxshard-bench", help="scratch folder")
    ap.add_argument("--skip-upstream", action="store_true")
    ap.add_argument("--upstream-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mixed", action="store_true",
                    help="clips of 1-15 s: bucketed order (ours) against padded random batches")
    ap.add_argument("--batch", type=int, default=4, help="--mixed: clips per micro-batch")
    ap.add_argument("--accum", type=int, default=1, help="--mixed: micro-batches per step")
    ap.add_argument("--split", action="store_true",
                    help="--mixed: also time the talker and code-predictor passes apart")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--predictor-frames", default="1,0.25,0.125,0.0625",
                    help="--mixed, --converge: ours at each F, comma-separated")
    ap.add_argument("--keep-gathered", default="auto",
                    help="--mixed: ours with parameters kept gathered from forward to backward "
                    "(auto: as the plan decides); comma-separated for an A/B, e.g. auto,off")
    ap.add_argument("--converge", action="store_true",
                    help="held-out loss at each F: the tiny model on the demo corpus")
    ap.add_argument("--converge-steps", type=int, default=120,
                    help="--converge: optimizer steps at each F")
    ap.add_argument("--val-every", type=int, default=10,
                    help="--converge: held-out loss every this many steps")
    ap.add_argument("--repeats", type=int, default=1,
                    help="--mixed: run both sides this many times, prints the ratio's "
                    "spread; --converge: seeds")
    return ap


def _print_state(args: argparse.Namespace, model_dir: Path, unsharded: dict[str, Any],
                 ours: dict[int, dict[str, Any]]) -> None:
    """Each rank's model state, unsharded and under FSDP, against the memory plan's."""
    from engine.config.train import TrainConfig
    from engine.train.plan import make_plan

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


def _print_steps(upstream: dict[str, Any] | None, ours: dict[int, dict[str, Any]]) -> None:
    """Step time, throughput, start-up and peak memory: upstream's structure and ours."""
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


def main() -> None:
    args = _parser().parse_args()
    if args.converge:
        main_converge(args)
        return
    if args.mixed:
        main_mixed(args)
        return
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

    print(f"\nModel: 0.6B configuration, {args.layers} talker layers, random weights, fp32 on "
          f"CPU ({threads} cores); {unsharded['n_params'] / 1e6:,.1f}M parameters, "
          f"{unsharded['n_trainable'] / 1e6:,.1f}M trainable (text embedding frozen).")
    print(f"Batch: {args.clips} clips x {args.seconds:g} s per optimizer step; "
          f"{args.steps} steps per run (first excluded from timings).\n")
    _print_state(args, model_dir, unsharded, ours)
    _print_steps(upstream, ours)


if __name__ == "__main__":
    main()
