"""Small training batches of the tiny model's layout, made without any audio.

- `layout_sequences` / `layout_batch`: four fixed sequences (seeded) and a batch of any
  of them, normalised for a world of `world` ranks (the sharding parity tests).
- `two_clip_batch`: two longer clips, collated as the data loader does, on the host.
- `saved_bytes`: what autograd keeps for backward in one forward of a batch (the memory
  plan's activation term, measured).
- `peak_bytes`: the highest memory one forward and backward of a batch holds above the
  model state (the plan's activation term is that peak).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.data.layout import LayoutIds, build_sequence, collate, count_tokens
from engine.train.loss import normalisers
from engine.train.objective import batch_to_device


def layout_sequences(model_dir: Path) -> tuple[list[Any], LayoutIds, torch.Tensor]:
    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    g = torch.Generator().manual_seed(11)
    seqs = []
    for n_text, n_frames in [(4, 5), (6, 3), (3, 6), (9, 12)]:
        text = torch.randint(0, 900, (n_text,), generator=g).tolist()
        codes = torch.randint(0, 2048, (n_frames, 16), generator=g).numpy()
        seqs.append(build_sequence(ids, [1, 2, 3], text, codes))
    xv = torch.randn(cfg["talker_config"]["hidden_size"], generator=g)
    return seqs, ids, xv


def layout_batch(seqs: list[Any], ids: LayoutIds, xv: torch.Tensor, which: list[int],
                 world: int) -> dict[str, torch.Tensor]:
    b = collate([seqs[i] for i in which], ids)
    b["x_vector"] = xv.expand(len(which), -1).numpy()
    t, s = count_tokens(seqs)
    b["talker_norm"], b["subtalker_norm"] = normalisers(t, s, world)
    return batch_to_device(b, "cpu")


def two_clip_batch(model_dir: Path) -> dict[str, Any]:
    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    rng = np.random.default_rng(0)
    seqs = [build_sequence(ids, [1, 2, 3], rng.integers(10, 500, n).tolist(),
                           rng.integers(0, 2048, (f, 16))) for n, f in ((9, 30), (5, 22))]
    batch = collate(seqs, ids)
    hidden = int(cfg["talker_config"]["hidden_size"])
    batch["x_vector"] = rng.standard_normal((2, hidden)).astype("float32")
    batch["talker_norm"], batch["subtalker_norm"] = normalisers(54, 52 * 15, 1)
    return batch


def saved_bytes(model: torch.nn.Module, batch: dict[str, Any]) -> int:
    """Bytes of the tensors autograd saves for backward in `model(batch)` (on the CPU),
    each storage once at its largest, the parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        kept[st.data_ptr()] = max(kept.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(batch_to_device(batch, "cpu"))
    return sum(n for ptr, n in kept.items() if ptr not in params)


def peak_bytes(model: torch.nn.Module, batch: dict[str, Any], scratch: Path) -> int:
    """Peak of the bytes allocated during `model(batch)` and its backward (on the CPU),
    above what was held before: the gradients exist already (one backward first, its
    gradients kept), so what is measured is what the step adds on top of the model state.
    Counted from the profiler's allocation records (`profile_memory`), in time order."""
    from torch.profiler import ProfilerActivity, profile

    b = batch_to_device(batch, "cpu")
    model.zero_grad(set_to_none=True)
    model(b)["loss"].backward()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(b)["loss"].backward()
    model.zero_grad(set_to_none=True)
    trace = scratch / "peak-trace.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    # frees before allocations of the same instant: never a peak that did not exist
    records = sorted((e["ts"], int(e["args"]["Bytes"])) for e in events
                     if e.get("name") == "[memory]")
    held = peak = 0
    for _, nbytes in records:
        held += nbytes
        peak = max(peak, held)
    return peak
