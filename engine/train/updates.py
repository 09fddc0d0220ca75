"""Whether the optimizer steps change the weights: the check after a run's first step, and
the update/weight ratio per group as a live metric.

Fine-tuning Qwen3-TTS fails quietly in the field: a sub-talker loss dropped for months
while the total looked fine, a learning rate so small the weights never moved. So after
the first optimizer step a run actually takes (an fp16 step skipped for overflow does not
count) every rank checks, per trainable group (the talker, the code predictor):

- its gradients are finite and not all zero, and a group the `trainable` choice trains
  has trainable parameters at all;
- its update is above what its weights' precision can represent: of the sampled weights
  whose gradient was not zero, at least `MIN_CHANGED` changed value;

and ends the run with `FatalTrainingError` (one sentence and what to do) when one fails.

Cost: every step reads back nothing of its own. Each parameter's local shard is sampled
at up to `SAMPLE` evenly spaced elements before the step, compared after it on the device,
and the per-group sums travel in the step's one all-reduce (`Trainer.all_sum`). The
update/weight ratio is ||delta|| / ||w|| over those samples. Gradient statistics (one pass
over the gradients) are computed on the checked step only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from engine.config.train import trained_groups
from engine.train.failures import FatalTrainingError
from engine.train.presets import KNOWN_TALKER_HIDDEN, optim_preset

#: groups in the order their values travel in the step's all-reduce
GROUPS: tuple[str, ...] = ("talker", "code_predictor")
#: what the window and the log call each group
GROUP_WORDS = {"talker": "talker", "code_predictor": "code predictor"}
#: elements sampled per parameter shard for the update measurements
SAMPLE = 2048
#: per group: sum of squared updates, of squared weights, changed and moving elements,
#: gradient |sum|, non-finite gradients, trainable tensors
VALUES_PER_GROUP = 7
#: below this fraction of moving sampled weights changed, the update is lost to rounding
MIN_CHANGED = 0.5


def _usual_lr() -> str:
    """The presets' learning rates of the published models, in words."""
    return ", ".join(f"{optim_preset(hidden)['lr']:g} for {name.split('-')[-2]}"
                     for name, hidden in KNOWN_TALKER_HIDDEN.items())


def metric_key(group: str) -> str:
    """The live metric of a group's update/weight ratio (engine and window)."""
    return f"update/{group}"


def _local(t: Any) -> Any:
    # a sharded parameter (FSDP2 DTensor): this rank's shard
    return (t.to_local() if hasattr(t, "to_local") else t).detach().reshape(-1)


class UpdateProbe:
    """Samples of every trainable parameter before a step; the per-group sums after it."""

    def __init__(self, groups: Mapping[str, Sequence[Any]]) -> None:
        self.groups = {g: list(groups.get(g, ())) for g in GROUPS}
        self._before: dict[str, list[tuple[Any, Any, Any]]] = {}
        self._grads: Any = None

    @staticmethod
    def _stride(n: int) -> int:
        return max(1, n // SAMPLE)

    def before_step(self, check: bool) -> None:
        """Sample the weights (and, if `check`, gather gradient statistics) before the step."""
        self._before = {}
        grad_stats = []
        for g in GROUPS:
            taken = []
            abs_sum = bad = None
            for p in self.groups[g]:
                w = _local(p)
                s = self._stride(w.numel())
                grad = None if p.grad is None else _local(p.grad)
                moving = (grad[::s] != 0) if grad is not None else torch.zeros_like(
                    w[::s], dtype=torch.bool)
                taken.append((p, w[::s].clone(), moving))
                if check and grad is not None:
                    a = grad.abs().sum(dtype=torch.float64)
                    b = (~torch.isfinite(grad)).sum(dtype=torch.float64)
                    abs_sum = a if abs_sum is None else abs_sum + a
                    bad = b if bad is None else bad + b
            self._before[g] = taken
            grad_stats.append((abs_sum, bad))
        self._grads = grad_stats if check else None

    def after_step(self, device: Any) -> Any:
        """(VALUES_PER_GROUP x groups) float64 values on `device`, for the step's all-reduce."""
        out = []
        for i, g in enumerate(GROUPS):
            zero = torch.zeros((), dtype=torch.float64, device=device)
            du = dw = changed = moving = zero
            for p, old, mov in self._before.get(g, ()):
                w = _local(p)
                new = w[::self._stride(w.numel())]
                delta = (new.to(torch.float64) - old.to(torch.float64))
                du = du + delta.square().sum()
                dw = dw + old.to(torch.float64).square().sum()
                changed = changed + ((new != old) & mov).sum(dtype=torch.float64)
                moving = moving + mov.sum(dtype=torch.float64)
            abs_sum, bad = self._grads[i] if self._grads is not None else (None, None)
            values = [du, dw, changed, moving, zero if abs_sum is None else abs_sum,
                      zero if bad is None else bad,
                      torch.tensor(float(len(self.groups[g])), dtype=torch.float64)]
            out.extend(v.to(device) for v in values)
        self._before, self._grads = {}, None
        return torch.stack(out)


def ratios(values: Sequence[float]) -> dict[str, float]:
    """{metric key: update/weight ratio} of the groups that train, from the summed values."""
    out = {}
    for i, g in enumerate(GROUPS):
        du, dw, *_rest, tensors = values[i * VALUES_PER_GROUP:(i + 1) * VALUES_PER_GROUP]
        if tensors > 0 and dw > 0:
            out[metric_key(g)] = math.sqrt(du / dw)
    return out


def check_first_step(values: Sequence[float], trainable: str, subtalker_weight: float,
                     lr: float, weight_dtype: str) -> str:
    """One line saying every group trains; raises FatalTrainingError when one does not.

    values: the summed `UpdateProbe.after_step` values of the run's first taken step.
    """
    expected = trained_groups(trainable)
    lines = []
    for i, g in enumerate(GROUPS):
        du, dw, changed, moving, abs_sum, bad, tensors = values[
            i * VALUES_PER_GROUP:(i + 1) * VALUES_PER_GROUP]
        word = GROUP_WORDS[g]
        if tensors == 0:
            if g in expected:
                raise FatalTrainingError(
                    "no_learning", f"The {word} is frozen although {{model.trainable}} is "
                    f"{trainable}, which trains it, so its weights would never change.",
                    "Report this as a bug; meanwhile choose a {model.trainable} that leaves the "
                    f"{word} out, or fine-tune with {{model.trainable}} talker, the default.")
            lines.append(f"{word} frozen")
            continue
        if bad > 0:
            raise FatalTrainingError(
                "no_learning", f"The {word}'s gradients after the first step hold {bad:.0f} "
                "NaN or infinite values, so its weights are now garbage.",
                "Lower {optim.lr}, or set {parallel.precision} to fp32; if it persists, "
                "prepare the voice again.")
        if abs_sum == 0:
            why = (" because the sub-talker loss weight is 0" if g == "code_predictor"
                   and subtalker_weight == 0 else "")
            todo = ("Give the sub-talker loss a weight above 0 ({model.subtalker_weight}, 0.3 "
                    "by default), or train without the code predictor ({model.trainable} "
                    "talker_layers)."
                    if why else "Check that the voice's clips have codes and transcripts "
                    "(prepare it again), then start a new run.")
            raise FatalTrainingError(
                "no_learning", f"The {word}'s gradients are all zero after the first step"
                f"{why}, so only weight decay would change it.", todo)
        if moving > 0 and changed / moving < MIN_CHANGED:
            raise FatalTrainingError(
                "no_learning", f"The first optimizer step changed {100 * changed / moving:.1f} % "
                f"of the {word}'s weights: its update (learning rate {lr:g} in this step) is "
                f"below what {weight_dtype} weights can represent, so training would change "
                "nothing.", f"Raise {{optim.lr}} (the usual start: {_usual_lr()}).")
        lines.append(f"{word} update/weight {math.sqrt(du / dw) if dw > 0 else 0.0:.2e}")
    return "first step checked: gradients finite and non-zero, " + ", ".join(lines)
