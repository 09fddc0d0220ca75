"""The engine's memory plan (`plan`, a dry run of `train`) in the Train page's words:
what each worker needs, what is free, whether it fits, and what to change, naming the
form's settings instead of command-line options."""

from __future__ import annotations

import re
from typing import Any

GIB = float(1 << 30)

#: command-line options in the engine's advice -> the form's names for them
_FORM_NAMES = [
    (r"\s*\(--activation-checkpointing\)", " (tick \u201cActivation checkpointing\u201d)"),
    (r"\s*\(--cpu-offload\)", " (tick \u201cOffload to CPU memory\u201d)"),
    (r"\s*\(--trainable lora\)", " (What trains: \u201cLoRA adapters\u201d)"),
    (r"\s*\(--workers (\d+)\)", r" (Workers: \1)"),
    (r"--base (\S+?)\.?$", r"choose \1 as the base model."),
    (r"\(--batch-size (\d+) --grad-accum (\d+)", r"(batch size \1 with \2 accumulation steps"),
    (r"--activation-checkpointing", "activation checkpointing"),
    (r"--trainable lora", "LoRA adapters"),
    (r"--cpu-offload", "offload to CPU memory"),
    (r"a smaller --batch-size", "a smaller batch size"),
]


def form_words(text: str) -> str:
    for pattern, repl in _FORM_NAMES:
        text = re.sub(pattern, repl, text)
    return text


def plan_words(plan: dict[str, Any]) -> str:
    """A few plain sentences from the engine's plan dict (MemoryPlan.to_dict)."""
    device = "GPU" if plan.get("device") == "cuda" else "CPU worker"
    workers = int(plan.get("workers") or 1)
    total = float(plan.get("total") or 0) / GIB
    words = [f"Each {device} needs about {total:.1f} GiB"]
    free = [float(f) / GIB for f in plan.get("free") or []]
    if device == "CPU worker":
        # the workers share the machine with the driver and Ray's processes: the whole run
        whole = float(plan.get("host_total") or 0) / GIB or total * workers
        words[0] += (f" ({whole:.1f} GiB for the whole run: the {workers} workers, the "
                     "driver and Ray's processes)")
        if free:
            words.append(f"{free[0]:.1f} GiB of memory is available")
    elif free:
        words.append("free per GPU: " + ", ".join(f"{f:.1f} GiB" for f in free))
    fits = bool(plan.get("fits"))
    text = "; ".join(words) + (": it fits." if fits else ": it does not fit.")
    ckpt = float(plan.get("checkpoint_bytes") or 0) / GIB
    if ckpt:
        text += f" Each checkpoint takes {ckpt:.1f} GiB of disk."
    advice = [form_words(str(a)) for a in plan.get("advice") or []]
    if advice and not fits:
        text += " To make it fit: " + " ".join(advice)
    return text
