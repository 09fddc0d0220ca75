"""The GPU proof's figures: the model FLOPs of a step and the GPU's peak (MFU), and one
configuration's row from its ranks' results (losses, step time, memory against the plan,
resumed losses against the uninterrupted run).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.proof_run import resume_step
from engine.audio.timebase import FRAME_RATE

GIB = float(1 << 30)
#: resumed vs uninterrupted loss on a GPU (non-deterministic attention backward, bf16)
RESUME_RTOL = 5e-3
#: bf16 dense peak FLOP/s by GPU name (vendor data sheets; SXM parts)
PEAK_BF16 = (("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
             ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("4090", 165e12),
             ("3090", 71e12))


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

    frames = max(2, int(seconds * FRAME_RATE))
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


def plan_bytes(model_dir: Path, cfg: Any, world: int, job: dict[str, Any]) -> int | None:
    from engine.train.plan import make_plan

    try:
        frames = max(2, int(job["seconds"] * FRAME_RATE))
        seq = frames + max(2, int(job["seconds"] * 3)) + 14
        plan = make_plan(model_dir, cfg.replace(parallel={"workers": world}),
                         device="cuda" if job["use_gpu"] else "cpu", free=[],
                         seq_len=seq, frames=frames, choices=False)
        return plan.total
    except Exception:
        return None
