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
(`engine.train.driver.worker_threads`: under CPU offload AdamW runs on the
host, on all its cores); the sockets and GPU numbering too
(`engine.train.launch.process_env`).

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
import gc
import importlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.core.jsonl import append_jsonl  # noqa: E402  (after the path: run as a script)

GIB = float(1 << 30)
#: resumed vs uninterrupted loss on a GPU (non-deterministic attention backward, bf16)
RESUME_RTOL = 5e-3
#: (module, what provides it); checked in this order before any work
NEEDED = (("torch", "torch"), ("numpy", "numpy"), ("safetensors", "safetensors"),
          ("einops", "einops"), ("psutil", "psutil"), ("yaml", "pyyaml"),
          ("tokenizers", "the device kit"), ("huggingface_hub", "the device kit"),
          ("transformers", "the device kit"), ("librosa", "the device kit"),
          ("soundfile", "the device kit"))
KIT_HINT = ("get it with the device kit: bash bench/device_kit.sh --python-version X.Y where "
            "the package registry is reachable, then on this machine pip install --no-index "
            "--no-deps --target build/device-kit/site build/device-kit/*.whl and run with "
            "PYTHONPATH=$PWD/build/device-kit/site")


def check_environment(also: tuple[tuple[str, str], ...] = ()) -> str | None:
    """One line naming every missing module or wrong version, or None when all is there
    (`NEEDED` and `also`: more (module, what provides it) pairs, e.g. the speech proof's).

    The official model code (qwen-tts 0.1.1) is written against transformers
    4.57.3: with 5.x its rotary init fails (ROPE_INIT_FUNCTIONS has no
    "default"), so a 5.x transformers is named like a missing one.
    """
    problems: list[str] = []
    for module, source in NEEDED + also:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # any failure to import is a missing piece, said in one line
            first = (str(exc).splitlines() or [""])[0][:120]
            problems.append(f"{module} ({source}; {type(exc).__name__}: {first})")
            continue
        if module == "transformers" and not str(mod.__version__).startswith("4.57."):
            problems.append(f"transformers 4.57.x (found {mod.__version__}; the official model "
                            "code needs 4.57.3)")
    if importlib.util.find_spec("qwen_tts") is None:
        problems.append("qwen_tts (the device kit: qwen-tts 0.1.1)")
    if not problems:
        try:  # the official modules, as the product imports them (no 25 Hz sox/onnx needs)
            from engine.model.official import modeling

            modeling()
        except Exception as exc:
            first = (str(exc).splitlines() or [""])[0][:160]
            problems.append(f"the official model code ({type(exc).__name__}: {first})")
    if not problems:
        return None
    return f"gpu_proof: missing {', '.join(problems)}; {KIT_HINT}."


def gpu_name() -> str | None:
    """The first visible GPU's name, through NVML (no CUDA context in this process)."""
    try:
        from engine.train.gpus import visible_gpus

        gpus = visible_gpus()
    except Exception:
        return None
    return gpus[0].name if gpus else None

#: real talker / code-predictor widths (qwen3-tts-facts.md)
SIZES: dict[str, dict[str, Any]] = {
    "0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28},
}
COMMON = {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
          "text_hidden_size": 2048, "text_vocab_size": 151936}
CODE_PREDICTOR = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
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
#: bf16 dense peak FLOP/s by GPU name (vendor data sheets; SXM parts)
PEAK_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
             ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("4090", 165e12),
             ("3090", 71e12))


# -- model folders ------------------------------------------------------------------------

def make_model_dir(out: Path, size: str | None) -> Path:
    """A model folder: the tiny model (size None) or random weights at real widths."""
    from engine.model.tiny import make_tiny_model

    if size is None:
        return out if (out / "config.json").exists() else make_tiny_model(out, seed=0)
    if (out / "model.safetensors").exists():
        return out
    import torch
    from safetensors.torch import save_file

    from engine.train.objective import build_talker

    tiny = make_model_dir(out.parent / "tiny-template", None)
    cfg = json.loads((tiny / "config.json").read_text())
    talker = cfg["talker_config"]
    talker.update(COMMON, **SIZES[size])
    talker.setdefault("rope_scaling", {})["mrope_section"] = [24, 20, 20]
    talker["code_predictor_config"].update(CODE_PREDICTOR)
    for sub in (talker, talker["code_predictor_config"]):
        if "layer_types" in sub:
            sub["layer_types"] = ["full_attention"] * int(sub["num_hidden_layers"])
    cfg["speaker_encoder_config"]["enc_dim"] = talker["hidden_size"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(0)
    # on CPU: the parent must not hold the GPU while the children measure it
    model = build_talker(out, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    sd = {f"talker.{k}": v.to(torch.bfloat16).contiguous()
          for k, v in model.state_dict().items()}
    del model
    save_file(sd, str(out / "model.safetensors"))
    del sd
    gc.collect()
    return out


# -- the builder the loop runs (product objective + parallelize, synthetic batches) ----

def _global_batch(model_dir: Path, clips: int, seconds: float, key: tuple[int, ...]) -> list[Any]:
    import numpy as np

    from engine.data.layout import LayoutIds, build_sequence

    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    rng = np.random.default_rng(list(key))
    frames = max(2, int(seconds * 12.5))
    vocab = int(cfg["talker_config"]["text_vocab_size"])
    return [build_sequence(ids, [1, 2, 3], rng.integers(10, min(vocab, 1000),
                                                        size=max(2, int(seconds * 3))).tolist(),
                           rng.integers(0, 2048, size=(frames, 16))) for _ in range(clips)]


def proof_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """Builder for `run_worker`: the product's pieces, synthetic deterministic data.

    Each micro-step draws one global batch from (epoch, position, micro) and
    every rank takes its slice, with the step's global token counts as the
    loss normalisers: any world size computes the same full-batch gradient.
    """
    import numpy as np

    from engine.data.frames import PredictorSample, rank_picks
    from engine.data.layout import LayoutIds, collate, count_tokens
    from engine.train.builder import TrainParts, sharded_objective
    from engine.train.loss import normalisers
    from engine.train.objective import batch_to_device, trainable_groups
    from engine.train.parallelize import set_gradient_sync, set_keep_gathered

    model_dir = Path(loop_config["model_dir"])
    objective, device, precision, detail = sharded_objective(cfg, loop_config, model_dir)
    model_cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(model_cfg)
    hidden = int(model_cfg["talker_config"]["hidden_size"])
    clips, seconds = cfg.data.batch_size, float(loop_config["seconds"])
    accum = cfg.data.grad_accum

    def step_batches(epoch: int, position: int) -> list[Any]:
        seqs = [_global_batch(model_dir, clips, seconds, (epoch, position, m))
                for m in range(accum)]
        t = s = 0
        for micro in seqs:
            a, b = count_tokens(micro)
            t, s = t + a, s + b
        norm = normalisers(t, s, world)
        sample = PredictorSample(cfg.model.predictor_frames, cfg.run.seed)
        if sample.active:  # every rank's frames of every micro-batch: the shared split
            blocks = np.array([[sum(int(q.frame_mask.sum()) for q in micro[r::world])
                                for r in range(world)] for micro in seqs])
            picks, sampled = rank_picks(blocks, sample, position, rank)
            norm = (norm[0], sampled * 15 / world)
        out = []
        for m, micro in enumerate(seqs):
            mine = micro[rank::world]
            b = collate(mine, ids)
            rng = np.random.default_rng([epoch, position, m, 99])
            b["x_vector"] = (rng.standard_normal((clips, hidden)).astype("float32")
                             * 0.02)[rank::world]
            b["talker_norm"], b["subtalker_norm"] = norm
            if sample.active:
                b["predictor_pick"] = picks[m]
            out.append(b)
        return out

    def forward(model: Any, batch: Any) -> dict[str, Any]:
        return model(batch_to_device(batch, device))

    return TrainParts(model=objective, device=device, steps_per_epoch=1 << 30,
                      step_batches=step_batches, forward=forward,
                      set_grad_sync=lambda on: set_gradient_sync(objective, on),
                      set_keep_gathered=lambda keep, last: set_keep_gathered(objective, keep,
                                                                             last),
                      precision=precision, info={"precision_detail": detail},
                      prepare=lambda b: batch_to_device(b, device, pin=True),
                      groups=lambda: trainable_groups(objective))


# -- one configuration, Ray-free, in processes of its own ------------------------------

def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def resume_step(steps: int) -> int | None:
    """The step a resumed configuration saves at: past the middle, so it is the run's only
    save (no second interval save, no final one); None when too few steps follow it."""
    step = steps // 2 + 1
    return step if step < steps else None


def _loop_config(cfg: Any, run_dir: Path, job: dict[str, Any], builder: str | None
                 ) -> dict[str, Any]:
    return {"config": cfg.to_dict(), "run_dir": str(run_dir), "total_steps": job["steps"],
            "builder": builder or "bench.gpu_proof:proof_builder",
            "model_dir": job["model_dir"], "seconds": job["seconds"], "save_final": False}


def _rank_main(rank: int, world: int, port: int, job: dict[str, Any], name: str) -> None:
    """One process of one configuration: the run, then (if resumed) the run again from its
    one checkpoint; the results go to a file, an exception ends the process (the parent
    reports it and goes on with the next configuration)."""
    import torch
    import torch.distributed as dist

    from engine.config.train import TrainConfig
    from engine.train.parallelize import process_group_backend
    from engine.train.trainer import ListSender, WorkerEnv, run_worker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank),
                      RANK=str(rank), WORLD_SIZE=str(world))
    use_gpu = bool(job["use_gpu"])
    if use_gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(process_group_backend(use_gpu), rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    try:
        overrides = dict(job["configs"][name])
        builder = overrides.pop("builder", None)
        cfg = TrainConfig.from_dict(json.loads(json.dumps(job["base_config"])))
        cfg = cfg.replace(**overrides) if overrides else cfg
        save_at = resume_step(job["steps"]) if name in job["resume_configs"] else None
        cfg = cfg.replace(run={"checkpoint_every": save_at or 1 << 30, "keep_checkpoints": 2,
                               "val_every": 0})
        run_dir = Path(job["out"]) / f"{_slug(name)}-n{world}"
        sender = ListSender()
        summary = run_worker(_loop_config(cfg, run_dir, job, builder),
                             WorkerEnv(rank=rank, world=world, sender=sender))
        res: dict[str, Any] = {"train": sender.of("train"),
                               "logs": [r["message"] for r in sender.of("log")],
                               "state_bytes": summary["state_bytes"]}
        if save_at:
            again = ListSender()  # resumes from the newest checkpoint in run_dir: save_at's
            run_worker(_loop_config(cfg, run_dir, job, builder),
                       WorkerEnv(rank=rank, world=world, sender=again))
            res["resumed"] = again.of("train")
        (Path(job["out"]) / f"{_slug(name)}-rank{rank}-n{world}.json").write_text(
            json.dumps(res, default=float))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_config(job: dict[str, Any], name: str, world: int,
               deadline: float | None) -> dict[str, Any]:
    """One configuration in `world` fresh processes (spawned: no state, compile cache or
    allocator pool carried from the one before, and a crash takes only this one along).

    Returns {"ranks": each rank's results}, {"error": one line} when a process raised
    or died, or {"stopped": True} when `deadline` (time.monotonic()) came first: then
    every process is killed, so the command ends within its limit.
    """
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_rank_main, args=(world, _free_port(), job, name), nprocs=world,
                             join=False, start_method="spawn")
    try:
        while not ctx.join(timeout=1.0):
            if deadline is not None and time.monotonic() >= deadline:
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.kill()
                for proc in ctx.processes:
                    proc.join()
                return {"stopped": True}
    except mp.ProcessRaisedException as exc:
        last = [line for line in str(exc).splitlines() if line.strip()][-1:] or ["?"]
        return {"error": f"rank {exc.error_index} raised {last[0].strip()[:300]}"}
    except mp.ProcessExitedException as exc:
        how = f"signal {exc.signal_name}" if exc.signal_name else f"exit code {exc.exit_code}"
        return {"error": f"rank {exc.error_index} died ({how})"}
    finally:
        shutil.rmtree(Path(job["out"]) / f"{_slug(name)}-n{world}", ignore_errors=True)
    out = Path(job["out"])
    return {"ranks": {r: json.loads((out / f"{_slug(name)}-rank{r}-n{world}.json").read_text())
                      for r in range(world)}}


# -- the budget and the rows ---------------------------------------------------------------

@dataclass
class Budget:
    """Seconds the whole proof may take (0: no limit), counted from `start`.

    A configuration is started only when the time left covers its estimate: the
    same configuration at another size scaled by the weights' size, else the
    median of this size's configurations so far, else the median at earlier
    sizes scaled likewise (nothing measured yet: any time left will do). What
    still runs at the limit is killed (`run_config`'s deadline).
    """

    seconds: float
    start: float
    clock: Callable[[], float] = time.monotonic
    #: (size, configuration) -> wall seconds
    took: dict[tuple[str, str], float] = field(default_factory=dict)
    #: size -> bytes of its weights (the scale between sizes)
    weights: dict[str, float] = field(default_factory=dict)

    @property
    def deadline(self) -> float | None:
        return self.start + self.seconds if self.seconds > 0 else None

    def left(self) -> float:
        return float("inf") if self.seconds <= 0 else self.start + self.seconds - self.clock()

    def estimate(self, size: str, name: str) -> float:
        def scale(other: str) -> float:
            return self.weights.get(size, 1.0) / self.weights.get(other, 1.0)

        same = [t * scale(s) for (s, n), t in self.took.items() if n == name and s != size]
        if same:
            return max(same)
        here = [t for (s, _), t in self.took.items() if s == size]
        if here:
            return statistics.median(here)
        before = [t * scale(s) for (s, _), t in self.took.items()]
        return statistics.median(before) if before else 0.0

    def may_start(self, size: str, name: str) -> bool:
        return self.left() > self.estimate(size, name)

    def record(self, size: str, name: str, seconds: float) -> None:
        self.took[(size, name)] = seconds


ROWS_FILE, TABLE_FILE = "gpu_proof.jsonl", "gpu_proof.txt"


class RowLog:
    """Each row printed as a table line and appended to the output folder the moment its
    configuration ends, so a proof killed at its time limit, or a crashed child, keeps
    every row before it."""

    def __init__(self, out: Path | None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.out = out
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for name in (ROWS_FILE, TABLE_FILE):
                (out / name).write_text("")  # this run's rows only

    def _text(self, text: str) -> None:
        print(text, flush=True)
        if self.out is not None:
            with open(self.out / TABLE_FILE, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")

    def add(self, row: dict[str, Any]) -> None:
        if not self.rows:
            self._text(TABLE_HEAD + "\n" + "-" * len(TABLE_HEAD))
        self.rows.append(row)
        if self.out is not None:
            append_jsonl(self.out / ROWS_FILE, row)
        self._text(table_line(row))


# -- the reinforce stage (issue 33) ----------------------------------------------------------

#: one measured stage: `texts` prompts of `group` renders each, `iterations` iterations
#: after one warm-up (not counted), `updates` optimizer steps per iteration
REINFORCE = {"texts": 2, "group": 8, "max_frames": 100, "iterations": 2, "updates": 1}
REINFORCE_TEXTS = ("The kettle started to whistle just as the phone rang in the hall.",
                   "Fresh bread tastes best while it is still warm from the oven.")


def reinforce_figures(folder: Path, device: str, plan: dict[str, int]) -> dict[str, Any]:
    """The reinforce stage's loop (`engine.reinforce.stage.Grpo`: rollouts by the engine's
    decoder from the policy's weights, then the clipped update against a frozen reference)
    on the voice in `folder`, in this process: rollout renders per second and the time of
    the update per optimizer step (everything after the rollouts: the layout, the old and
    the reference log-probabilities, the steps). The reward is one a policy can raise
    (the share of codebook-0 codes below 1024): the figures are the stage's own cost,
    without the scorers' (the encoder and recogniser are timed by the evaluation)."""
    import torch

    from engine.config.reinforce import ReinforceConfig
    from engine.data.layout import LayoutIds
    from engine.model.loading import load_model
    from engine.reinforce.rollout import Render, Roller
    from engine.reinforce.stage import Grpo, frozen_copy
    from engine.train.objective import VoiceObjective, set_trainable

    cuda = device != "cpu"

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    dtype = torch.bfloat16 if cuda else torch.float32
    wrapper = load_model(folder, device=device, dtype=dtype)
    policy = VoiceObjective(wrapper.model.talker)
    set_trainable(policy, "talker")
    reference = frozen_copy(policy)
    config = json.loads((folder / "config.json").read_text())
    hidden = int(config["talker_config"]["hidden_size"])
    speaker = (torch.randn(hidden, generator=torch.Generator().manual_seed(1)) * 0.1).to(
        device, dtype)
    spent = {"sample": 0.0, "frames": 0.0}

    class TimedRoller(Roller):
        def sample(self, texts: list[str], group: int, max_frames: int, seed: int
                   ) -> list[Render]:
            began = now()
            renders = super().sample(texts, group, max_frames, seed)
            spent["sample"] += now() - began
            spent["frames"] += sum(len(r.codes) for r in renders)
            return renders

    def low_share(renders: list[Render], _texts: list[str]) -> list[float]:
        return [float((r.codes[:, 0] < 1024).mean()) if len(r.codes) else 0.0
                for r in renders]

    roller = TimedRoller(wrapper.model, wrapper.processor, wrapper.processor.tokenizer,
                         speaker, LayoutIds.from_config(config))
    cfg = ReinforceConfig(group=plan["group"], iterations=plan["iterations"] + 1,
                          updates=plan["updates"], max_frames=plan["max_frames"], lr=1e-5)
    grpo = Grpo(policy, reference, roller, low_share, cfg)
    texts = list(REINFORCE_TEXTS[:plan["texts"]])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timed: list[tuple[float, float, float, dict[str, float]]] = []
    for it in range(cfg.iterations):
        spent.update(sample=0.0, frames=0.0)
        began = now()
        row = grpo.iteration(it, texts)
        timed.append((now() - began, spent["sample"], spent["frames"], row))
    measured = timed[1:] or timed  # the first iteration warms up kernels and the allocator
    renders = len(texts) * cfg.group * len(measured)
    sample_s = sum(t[1] for t in measured)
    update_s = sum(t[0] - t[1] for t in measured) / len(measured)
    peak = (torch.cuda.max_memory_allocated() / GIB if cuda else
            __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss
            / (1 << 20))
    return {"device": device, "dtype": str(dtype).removeprefix("torch."),
            "renders_per_iteration": len(texts) * cfg.group, "updates": cfg.updates,
            "rollout_renders_per_s": round(renders / sample_s, 3) if sample_s > 0 else 0.0,
            "frames_per_render": round(sum(t[2] for t in measured) / renders, 1),
            "rollout_s": round(sample_s / len(measured), 3), "update_s": round(update_s, 3),
            "update_step_s": round(update_s / cfg.updates, 3), "peak_gib": round(peak, 2),
            "reward": [round(t[3]["reward"], 4) for t in timed],
            "kl": [round(t[3]["kl"], 5) for t in timed]}


def _reinforce_main(_rank: int, job: dict[str, Any]) -> None:
    """The reinforce row in a process of its own (the parent holds no CUDA context)."""
    row = reinforce_figures(Path(job["folder"]), job["device"], job["plan"])
    Path(job["row_file"]).write_text(json.dumps(row, default=float))


def _reinforce_row(label: str, size: str | None, env: dict[str, Any]) -> None:
    """The reinforce stage at one size (the first): its row, or why there is none."""
    import torch.multiprocessing as mp

    budget, log = env["budget"], env["log"]
    row: dict[str, Any] = {"config": "reinforce", "gpus": 1, "size": label}
    if env["args"].no_reinforce:
        return
    if not budget.may_start(label, "reinforce"):
        log.add({**row, "skipped": "the time budget is spent"})
        return
    began = time.monotonic()
    work = Path(env["work"]) / "reinforce"
    spec = importlib.util.spec_from_file_location("bench_synth",
                                                  ROOT / "bench" / "bench_synth.py")
    assert spec is not None and spec.loader is not None
    bench_synth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_synth)
    # a voice folder (the codec and processor beside the talker) at the size's widths
    folder = (bench_synth.tiny_voice(work) if size is None else
              bench_synth.voice_06b(work, int(SIZES[size].get("num_hidden_layers", 28)),
                                    SIZES[size], name=size.replace(".", "")))
    job = {"folder": str(folder), "device": "cuda" if env["use_gpu"] else "cpu",
           "plan": REINFORCE, "row_file": str(work / "row.json")}
    ctx = mp.start_processes(_reinforce_main, args=(job,), nprocs=1, join=False,
                             start_method="spawn")
    try:
        while not ctx.join(timeout=1.0):
            if budget.deadline is not None and time.monotonic() >= budget.deadline:
                for proc in ctx.processes:
                    proc.kill()
                    proc.join()
                row["stopped"] = True
                break
        else:
            row.update(json.loads(Path(job["row_file"]).read_text()))
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        last = [line for line in str(exc).splitlines() if line.strip()][-1:] or ["?"]
        row["error"] = last[0].strip()[:300]
    took = time.monotonic() - began
    budget.record(label, "reinforce", took)
    log.add({**row, "wall_s": round(took, 1)})


# -- the Ray path ------------------------------------------------------------------------

def run_ray(job: dict[str, Any], world: int) -> list[float]:
    """The plain configuration through Ray Train (the product's launcher): rank 0's losses."""
    from engine.cluster import connect
    from engine.config.train import TrainConfig
    from engine.core.events import Emitter
    from engine.train.launch import Launch, LaunchSpec

    cfg = TrainConfig.from_dict(json.loads(json.dumps(job["base_config"])))
    cfg = cfg.replace(run={"checkpoint_every": 1 << 30, "val_every": 0})
    run_dir = Path(job["out"]) / "ray-plain"
    threads = max(1, (os.cpu_count() or 1) // world)
    if not job["use_gpu"]:
        cfg = cfg.replace(parallel={"cpu_threads_per_worker": threads})
    cluster = connect(None, num_cpus=max(os.cpu_count() or 1, world * threads))
    try:
        spec = LaunchSpec(config=cfg.to_dict(), run_dir=run_dir, total_steps=job["steps"],
                          workers=world, use_gpu=bool(job["use_gpu"]),
                          cpus_per_worker=cfg.parallel.cpu_threads_per_worker, max_failures=0,
                          builder="bench.gpu_proof:proof_builder",
                          extra={"model_dir": job["model_dir"], "seconds": job["seconds"],
                                 "save_final": False})
        result = Launch(spec, Emitter()).start().wait()
    finally:
        cluster.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return [r["values"]["loss/train"] for r in result.records
            if r["kind"] == "train" and r["rank"] == 0]


# -- figures -------------------------------------------------------------------------------

def model_flops(model_dir: Path, clips: int, seconds: float, trainable: str,
                predictor_frames: float = 1.0) -> float:
    """FLOPs of one optimizer step's useful work (no recomputation), from the layer shapes.

    Per talker token: 2 x the talker's matmul weights (decoder layers,
    text_projection, codec_head) forward, the same again backward for input
    gradients, and 2 x the *trainable* weights for weight gradients; causal
    attention adds 2 x 2 x seq x (heads x head_dim) per layer forward (x3 in
    all). The code predictor runs 16 positions per audio frame, its 15 heads
    one position each, on `predictor_frames` of the frames. Embedding lookups are not
    FLOPs.
    """
    cfg = json.loads((model_dir / "config.json").read_text())
    t, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]

    def layer_weights(c: dict[str, Any]) -> int:
        h, i = int(c["hidden_size"]), int(c["intermediate_size"])
        q = int(c["num_attention_heads"]) * int(c.get("head_dim") or h // int(
            c["num_attention_heads"]))
        kv = int(c["num_key_value_heads"]) * int(c.get("head_dim") or q // int(
            c["num_attention_heads"]))
        return h * q + 2 * h * kv + q * h + 3 * h * i

    frames = max(2, int(seconds * 12.5))
    seq = frames + max(2, int(seconds * 3)) + 14
    tok, cp_tok = clips * seq, clips * frames * 16 * predictor_frames
    lt = int(t["num_hidden_layers"]) * layer_weights(t)
    talker_w = lt + int(t["text_hidden_size"]) * int(t["hidden_size"]) * 2 + int(
        t["hidden_size"]) * int(t["vocab_size"])
    lc = int(cp["num_hidden_layers"]) * layer_weights(cp)
    cp_w = lc + int(t["hidden_size"]) * int(cp["hidden_size"])
    heads = 15 * int(cp["hidden_size"]) * int(cp["vocab_size"])
    fwd = 2 * (talker_w * tok + cp_w * cp_tok + heads * clips * frames * predictor_frames)
    attn = 2 * 2 * int(t["num_hidden_layers"]) * seq * int(t["num_attention_heads"]) * int(
        t["head_dim"]) * tok * 0.5
    attn += 2 * 2 * int(cp["num_hidden_layers"]) * 16 * int(cp["num_attention_heads"]) * int(
        cp["head_dim"]) * cp_tok * 0.5
    if trainable == "lora":
        grads = 0.0  # adapters are a rounding error next to the base weights
    else:
        grads = fwd
    return float(fwd + fwd + grads + 3 * attn)


def peak_flops(name: str | None) -> float | None:
    """bf16 dense peak of the GPU called `name` (None: unknown or no GPU)."""
    if not name:
        return None
    return next((v for k, v in PEAK_BF16 if k in name), None)


def summarise(name: str, world: int, ranks: dict[int, dict[str, Any]], job: dict[str, Any],
              plan_bytes: int | None, flops: float, peak: float | None) -> dict[str, Any]:
    r0 = ranks[0]
    row: dict[str, Any] = {"config": name, "gpus": world, "size": job["size_label"]}
    if not r0.get("train"):
        row["error"] = "no steps"
        return row
    train = r0["train"]
    losses = [t["loss/train"] for t in train]
    times = [t["perf/step_s"] for t in train[1:]] or [train[0]["perf/step_s"]]
    step_s = statistics.median(times)
    tokens = statistics.median(t["perf/tokens"] for t in train)
    row.update(first_loss=losses[0], final_loss=losses[-1], step_s=step_s,
               tokens_per_s=tokens / step_s if step_s else 0.0,
               precision=next((m.split(": ", 1)[1] for m in r0.get("logs", [])
                               if m.startswith("precision: ")), ""))
    if peak:
        row["mfu"] = flops / step_s / world / peak
    mem = [ranks[r]["train"][-1] for r in sorted(ranks) if ranks[r].get("train")]
    if "memory/device_used_peak_gib" in mem[0]:
        row["peak_gib"] = [m["memory/peak_gib"] for m in mem]
        row["device_used_gib"] = [m["memory/device_used_peak_gib"] for m in mem]
    else:
        row["peak_rss_gib"] = [m.get("memory/peak_gib") for m in mem]
    if plan_bytes is not None:
        row["plan_gib"] = plan_bytes / GIB
    row["state_bytes"] = [ranks[r].get("state_bytes") for r in sorted(ranks)]
    if "resumed" in r0:
        saved = resume_step(job["steps"]) or job["steps"]
        again = {t["step"]: t["loss/train"] for t in r0["resumed"]}
        first = {t["step"]: t["loss/train"] for t in train}
        common = [s for s in range(saved + 1, job["steps"] + 1) if s in again and s in first]
        rtol = RESUME_RTOL if job["use_gpu"] else 0.0
        worst = max((abs(again[s] - first[s]) / max(abs(first[s]), 1e-12) for s in common),
                    default=0.0)
        row["resume_equal"] = bool(common) and worst <= rtol
        row["resume_max_rel"] = worst
        row["resume_rtol"] = rtol
        row["resumed_steps"] = common
    return row


def _plan_bytes(model_dir: Path, cfg: Any, world: int, job: dict[str, Any]) -> int | None:
    from engine.train.plan import make_plan

    try:
        frames = max(2, int(job["seconds"] * 12.5))
        seq = frames + max(2, int(job["seconds"] * 3)) + 14
        plan = make_plan(model_dir, cfg.replace(parallel={"workers": world}),
                         device="cuda" if job["use_gpu"] else "cpu", free=[],
                         seq_len=seq, frames=frames, choices=False)
        return plan.total
    except Exception:
        return None


TABLE_HEAD = (f"{'size':<6}{'config':<16}{'N':>2} {'loss 1st->last':>16} {'resume':>7} "
              f"{'step s':>7} {'tok/s':>8} {'MFU':>6} {'peak GiB':>10} {'used GiB':>10} "
              f"{'plan GiB':>9} {'wall s':>7}")


def table_line(r: dict[str, Any]) -> str:
    """One row of the table (a measured configuration, a failed, stopped or skipped one,
    or the Ray comparison)."""
    lead = f"{r['size']:<6}{r['config']:<16}{r['gpus']:>2} "
    if "ray_losses" in r:
        return lead + (f"final loss {r['ray_losses'][-1]:.4f}, "
                       + ("equal to the Ray-free run" if r["ray_equal"]
                          else "DIFFERS from the Ray-free run"))
    if "skipped" in r:
        return lead + f"not started: {r['skipped']}"
    if r.get("stopped"):
        return lead + f"stopped at the time budget after {r.get('wall_s', 0):.0f} s"
    if "error" in r:
        return lead + f"failed: {r['error']}"
    if "rollout_renders_per_s" in r:
        return lead + (f"rollouts {r['rollout_renders_per_s']:.2f} renders/s "
                       f"({r['frames_per_render']:.0f} frames each), update step "
                       f"{r['update_step_s']:.3f} s, peak {r['peak_gib']:.2f} GiB")

    def fmt(v: Any) -> str:
        return "/".join(f"{x:.2f}" for x in v) if v else "-"

    peak = r.get("peak_gib") or r.get("peak_rss_gib")
    return (lead + f"{r['first_loss']:>7.3f}->{r['final_loss']:<7.3f} "
            f"{({True: 'equal', False: 'DIFFERS'}.get(r.get('resume_equal'), '-')):>7} "
            f"{r['step_s']:>7.3f} {r['tokens_per_s']:>8.0f} "
            f"{(format(r['mfu'], '.1%') if 'mfu' in r else '-'):>6} {fmt(peak):>10} "
            f"{fmt(r.get('device_used_gib')):>10} "
            f"{(format(r['plan_gib'], '.2f') if 'plan_gib' in r else '-'):>9} "
            f"{r.get('wall_s', 0):>7.0f}")


def _sweep(model_dir: Path, base: Any, batches: list[int], world: int,
           args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Plain configurations at larger micro-batches, each only if the plan says it fits."""
    from engine.train.plan import gpu_free_memory, make_plan

    frames = max(2, int(args.seconds * 12.5))
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
    from engine.train.driver import worker_threads

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
                                _plan_bytes(model_dir, cfg, world, job), flops, env["peak"])
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
    from engine.train.launch import process_env

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
            _reinforce_row("tiny", None, env)
        else:
            for i, size in enumerate(sizes):
                _measure_size(size, size, size_order(names, size), env)
                if i == 0:  # the stage's figures at the first size, before the larger ones
                    _reinforce_row(size, size, env)
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
