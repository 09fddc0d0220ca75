"""A micro-step never waits on the host (issue 18): counted, not timed.

Inside one micro-step (forward, backward, the running loss sums) no op may
read a value back from the device. On CPU nothing actually waits, so the test
counts the ops that would make a GPU stop the host: `_local_scalar_dense`
(`.item()`, `float()`, `bool()` of a tensor) and the ops whose output size
lives on the device (`nonzero`, `masked_select`, boolean-mask indexing), under
a `TorchDispatchMode` that sees every aten call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.batches import two_clip_batch
from tests.helpers.host_syncs import SyncCounter


@pytest.fixture(scope="module")
def objective(tiny_model_dir: Path) -> Any:
    from engine.train.objective import build_objective

    torch.manual_seed(0)
    return build_objective(tiny_model_dir, None, device="cpu")


def _micro_step(objective: Any, batch: dict[str, Any]) -> tuple[SyncCounter, Any]:
    from engine.train.trainer import add_sums

    objective.zero_grad(set_to_none=True)
    with SyncCounter() as counter:
        out = objective(batch)
        (out["loss"] / 2).backward()
        sums = add_sums(None, out)
    return counter, sums


def test_a_micro_step_reads_nothing_back(objective: Any, tiny_model_dir: Path) -> None:
    from engine.train.objective import batch_to_device

    # prepared as the prefetch thread does: on the device, gather rows built on the host
    batch = batch_to_device(two_clip_batch(tiny_model_dir), "cpu", pin=True)
    counter, sums = _micro_step(objective, batch)
    assert counter.hits == [], counter.hits
    # the counts came along with the rows: the masks' own, read here after the step
    assert float(sums[1]) == float(batch["target_mask"][:, 1:].sum())
    assert float(sums[3]) == 15 * float(batch["frame_mask"][:, 1:].sum())


def test_the_counter_sees_the_mask_fallback(objective: Any, tiny_model_dir: Path) -> None:
    """Without host-built rows the loss falls back to masks, and the counter sees it: the
    zero above is the absence of syncs, not a blind counter. Same loss, same gradients."""
    from engine.train.objective import batch_to_device

    prepared = batch_to_device(two_clip_batch(tiny_model_dir), "cpu")
    _, sums_rows = _micro_step(objective, prepared)
    grads_rows = [p.grad.clone() for p in objective.parameters() if p.grad is not None]
    masks_only = {k: v for k, v in prepared.items()
                  if k not in ("talker_rows", "frame_rows", "talker_count", "subtalker_count")}
    counter, sums_masks = _micro_step(objective, masks_only)
    assert "aten::nonzero" in counter.hits
    # the same rows in the same order through the same kernels: bit-identical
    assert torch.equal(sums_rows, sums_masks)
    grads_masks = [p.grad for p in objective.parameters() if p.grad is not None]
    assert all(torch.equal(a, b) for a, b in zip(grads_rows, grads_masks, strict=True))
