"""The GPU proof's time budget and its rows: a configuration starts only when its estimate
fits the time left, and each row is printed and written to the output folder the moment its
configuration ends (a proof killed at its time limit keeps every row before).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.jsonl import append_jsonl


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
