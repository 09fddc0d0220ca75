"""The driver side of live metrics: the Ray queue the ranks put into, and the pump that
drains it into events and metrics.jsonl (the worker side is `engine.train.metrics`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ray.util.queue import Empty, Queue

from engine.core.events import Emitter

#: records waiting in the queue before workers start dropping (the driver
#: drains every few hundred ms; only a stalled driver can fill this)
QUEUE_SIZE = 10_000


def make_queue(**actor_options: Any) -> Any:
    """The metrics queue actor. num_cpus=0: it must not take a worker's CPU slot.

    `actor_options` add to Ray's options, e.g. a scheduling strategy that keeps
    the queue on the driver's node (launch does: on a cluster, a queue on a
    node that dies would silently swallow every metric after the restart).
    """
    return Queue(maxsize=QUEUE_SIZE,
                 actor_options={"num_cpus": 0, "max_concurrency": 64, **actor_options})


class MetricsPump:
    """Driver side: a thread that drains the queue, emits events, appends metrics.jsonl.

    Polls with a blocking `get(timeout=poll_s)`, so a record reaches the
    emitter within about `poll_s` of being put (default 0.25 s).
    """

    def __init__(self, queue: Any, emitter: Emitter, jsonl_path: Path | None,
                 poll_s: float = 0.25,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.queue = queue
        self.emitter = emitter
        self.jsonl_path = jsonl_path
        self.poll_s = poll_s
        self.on_record = on_record
        self.records: list[dict[str, Any]] = []
        self.first_metric_time: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voxshard-metrics", daemon=True)
        self._file = None
        if jsonl_path is not None:
            jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            # append: a resumed run continues the same history
            self._file = open(jsonl_path, "a", encoding="utf-8", buffering=1)

    def start(self) -> MetricsPump:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self.queue.get(block=True, timeout=self.poll_s)
            except Empty:
                continue
            except Exception:  # the queue actor died with the cluster: nothing more will come
                if self._stop.wait(self.poll_s):
                    break
                continue
            self._handle_all([first, *self._drain()])
        # what arrived between the last poll and stop()
        try:
            self._handle_all(self._drain())
        except Exception:
            pass

    def _drain(self) -> list[dict[str, Any]]:
        try:
            n = self.queue.qsize()
            return self.queue.get_nowait_batch(n) if n else []
        except Exception:
            return []

    def _handle_all(self, records: Iterable[dict[str, Any]]) -> None:
        for rec in records:
            self.handle(rec)

    def handle(self, rec: dict[str, Any]) -> None:
        kind = rec.get("kind")
        values = rec.get("values", {})
        if kind == "log":
            self.emitter.log(str(values.get("message", "")), level=str(values.get("level", "info")),
                             rank=rec.get("rank"))
            return
        if kind == "state":
            self.emitter.state(str(values.get("state", "")), detail=values.get("detail", ""))
            return
        if kind in ("train", "val", "reinforce"):  # reinforce: the stage's iterations
            if self.first_metric_time is None:
                self.first_metric_time = time.time()
            self.records.append(rec)
            if self._file is not None:
                self._file.write(json.dumps({"kind": kind, "rank": rec.get("rank"),
                                             "time": round(rec.get("time", 0.0), 3), **values},
                                            default=float) + "\n")
            # `sent`: when the worker measured it; the event's own time minus
            # this is the delivery latency
            self.emitter.metric(values, rank=rec.get("rank"), split=kind,
                                sent=round(float(rec.get("time", 0.0)), 3))
            if self.on_record is not None:
                self.on_record(rec)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        if self._file is not None:
            self._file.close()
            self._file = None
