"""The reinforce stage's row of the GPU proof (issue 33): rollout renders per second and the
update's time per optimizer step, measured in a process of its own.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.proof_figures import GIB
from bench.proof_model import SIZES

ROOT = Path(__file__).resolve().parent.parent

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
        def sample(self, texts: list[str], group: int, max_frames: int, seed: int,
                   styles: Sequence[str | None] | None = None) -> list[Render]:
            began = now()
            renders = super().sample(texts, group, max_frames, seed, styles)
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


def reinforce_row(label: str, size: str | None, env: dict[str, Any]) -> None:
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
