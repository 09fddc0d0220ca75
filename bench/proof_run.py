"""One configuration of the GPU proof in processes of its own: Ray-free (one
`torch.distributed` process per GPU, spawned fresh), with a resumed run from its one
checkpoint where asked; and the plain configuration through Ray Train, the product's
launcher. Neither imports torch or ray before it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from bench.proof_model import PROOF_BUILDER


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
            "builder": builder or PROOF_BUILDER,
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
                          builder=PROOF_BUILDER,
                          extra={"model_dir": job["model_dir"], "seconds": job["seconds"],
                                 "save_final": False})
        result = Launch(spec, Emitter()).start().wait()
    finally:
        cluster.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return [r["values"]["loss/train"] for r in result.records
            if r["kind"] == "train" and r["rank"] == 0]
