"""Checkpoint save and load time by storage: a local folder, an S3 bucket written
straight through DCP's fsspec writer (what `--storage s3://` does), and local
staging then upload (the alternative we did not take).

The bucket is moto's S3 server on loopback (the test extra), so the figures
show the client-side cost of each path (serialisation, requests), not a real
network. One process, no Ray: `engine.train.checkpoint.Checkpointer` on a
model whose state (weights + AdamW) is about `--mib` MiB.

    .venv/bin/python bench/bench_storage.py [--mib 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256, help="weights + optimizer state, MiB")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://{host}:{port}")
    import fsspec
    import torch

    from engine.layout.checkpoints import latest_checkpoint
    from engine.train.checkpoint import Checkpointer

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("bench")
    # params + grads-free AdamW (2 moments): 3 x fp32 copies of the weights
    n = args.mib * (1 << 20) // 12
    side = int(n ** 0.5)
    model = torch.nn.Linear(side, side, bias=False)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, side)).sum().backward()
    opt.step()
    size = sum(p.numel() * 4 * 3 for p in model.parameters()) / (1 << 20)
    tmp = Path(tempfile.mkdtemp(prefix="bench_storage."))
    results: dict[str, list[float]] = {}

    def timed(name: str, fn: Any, *fn_args: Any) -> Any:
        t = time.perf_counter()
        out = fn(*fn_args)
        results.setdefault(name, []).append(time.perf_counter() - t)
        return out

    def stage_then_upload(staged: Any, dest: str) -> None:
        path = staged.save(1, model, opt, None, {})
        fs.put(str(path), f"{dest}/{path.name}", recursive=True)

    try:
        for i in range(args.repeat):
            local = Checkpointer(tmp / f"local{i}", 0, 1)
            timed("local folder: save", local.save, 1, model, opt, None, {})
            s3 = Checkpointer(f"s3://bench/direct{i}", 0, 1)
            timed("S3 straight (fsspec writer): save", s3.save, 1, model, opt, None, {})
            timed("S3 via local staging + upload: save", stage_then_upload,
                  Checkpointer(tmp / f"staged{i}", 0, 1), f"bench/staged{i}")
            timed("local folder: load", local.load, latest_checkpoint(tmp / f"local{i}"),
                  model, opt, None)
            timed("S3 straight: load", s3.load, latest_checkpoint(f"s3://bench/direct{i}"),
                  model, opt, None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        server.stop()
    print(f"checkpoint of {size:.0f} MiB (weights + AdamW), median of {args.repeat}:")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"  {name:<38} {med:6.2f} s  {size / med:7.1f} MiB/s")


if __name__ == "__main__":
    main()
