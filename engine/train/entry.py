"""The functions Ray Train runs in every worker: make the driver's paths real on
this node, build the rank's environment from Ray's context, then train."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train import Checkpoint, CheckpointUploadMode

from engine.train.metrics import MetricsSender
from engine.train.preflight import node_model_dir, unpack_voice_data
from engine.train.stop import StopPoller
from engine.train.trainer import WorkerEnv, run_worker


def report_checkpoint(path: Path, metrics: dict[str, Any]) -> None:
    """Tell Ray Train about a checkpoint already written inside its run folder.

    NO_UPLOAD: the shards are where Ray keeps checkpoints, so nothing is
    copied; Ray registers it for restarts and deletes old ones
    (`CheckpointConfig.num_to_keep`). Every rank must call this (a barrier);
    only rank 0 passes the checkpoint.
    """
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    checkpoint = None
    if rank == 0:
        # named inside Ray's own storage filesystem, which is where `path` is (a
        # folder or a URI): Ray sees it as its own and can delete it later
        storage = ctx.get_storage()
        checkpoint = Checkpoint(path=f"{storage.experiment_fs_path.rstrip('/')}/{path.name}",
                                filesystem=storage.storage_filesystem)
    ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=path.name,
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def train_loop(loop_config: dict[str, Any]) -> None:
    """Entry point given to `TorchTrainer(train_loop_per_worker=...)`."""
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    ray_ckpt = ray.train.get_checkpoint()

    def gpu_device() -> Any:
        return ray.train.torch.get_device()

    env = WorkerEnv(rank=rank, world=world, sender=MetricsSender(loop_config.get("queue"), rank),
                    stop=StopPoller(loop_config.get("stop_flag")),
                    restored=Path(ray_ckpt.path) if ray_ckpt is not None else None,
                    report_checkpoint=report_checkpoint, gpu_device=gpu_device)
    run_worker(loop_config, env)


def node_train_loop(loop_config: dict[str, Any]) -> None:
    """Every worker's entry point: make the driver's paths real on this node, then train.

    - the base model: the driver's folder if this node has it at the same
      path, else the hub id from this node's cache or a download (once per
      node); a node that cannot get it ends the run at once, named
      (`FatalTrainingError`, never retried);
    - the voice: the prepared codes and x-vector from the object store,
      unpacked once per node (content-addressed), never the driver's folder.
    """
    cfg = dict(loop_config)
    announce_node(cfg)
    data = cfg.pop("voice_data", None)
    if data is not None:
        bundle = ray.get(data) if isinstance(data, ray.ObjectRef) else data
        cfg["voice_dir"] = str(unpack_voice_data(bundle))
    if cfg.get("model_dir"):
        # a download on this node is said in the driver's log (once per node: a lock)
        say = MetricsSender(cfg.get("queue"), ray.train.get_context().get_world_rank()).log
        cfg["model_dir"] = str(node_model_dir(str(cfg["model_dir"]), cfg.get("model_spec"),
                                              log=say))
    train_loop(cfg)


def announce_node(loop_config: dict[str, Any]) -> None:
    """Tell the driver where this rank runs: a `worker_node` state event (rank,
    node name, address, Ray node id, the GPUs Ray gave it), for per-node labels."""
    try:
        rank = ray.train.get_context().get_world_rank()
        ctx = ray.get_runtime_context()
        gpus = [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
        MetricsSender(loop_config.get("queue"), rank).send("state", {
            "state": "worker_node", "rank": rank, "node": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(),
            "gpus": gpus, "detail": f"rank {rank} on {socket.gethostname()}"
            + (f" GPU {','.join(gpus)}" if gpus else "")})
    except Exception:  # labels only: never fail a run for them
        pass
