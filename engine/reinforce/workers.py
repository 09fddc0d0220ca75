"""The reinforce stage on Ray: the policy update in Ray Train / FSDP2 workers (training's
launcher, `engine.train.launch`), rollouts and scoring in one Ray actor beside them.

- `Rollouts` (an actor; the reward `[reinforce] reward` names (by default the recogniser
  and the encoder), the frozen reference and a whole copy of the policy, loaded once):
  each iteration it takes the policy's weights (`load`), samples the renders from them,
  scores them and hands each rank its share (`shards`): the renders laid out as training
  clips, their codes' log-probabilities under the policy that sampled them and under the
  reference, and their advantages.
- `reinforce_loop` (every Ray Train worker): the policy is the training objective built
  and sharded as training builds it (`PolicyObjective`: its forward gives the batch's code
  log-probabilities, so FSDP2 gathers and reduces as in a training step); the start
  checkpoint is loaded through training's `Checkpointer`, then the stage's own newest in
  the run folder if there is one: on `--resume`, and when Ray Train restarts the worker
  group after a worker was lost (`max_failures`, as for training), so a restarted group
  continues from the last saved iteration and draws its renders again the same.
  Per iteration: the full trainable weights are gathered (a collective) and rank 0 sends
  them to the actor, which rolls out from them; every rank updates on its share (FSDP
  averages the gradients over ranks, so equal shares give the whole batch's mean); rank 0
  sends the iteration's figures to the run's metrics (kind "reinforce"); every
  `checkpoint_every` iterations, at the end and at a Stop, all ranks save a checkpoint in
  training's format. A failure of the actor (the reward raising, the actor gone) ends the
  stage at once (`FatalTrainingError`): a restart would only meet it again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from engine.config.reinforce import ReinforceConfig
from engine.config.train import TrainConfig
from engine.layout.checkpoints import latest_checkpoint, step_of
from engine.layout.run import Run
from engine.layout.voice import open_voice
from engine.reinforce.models import StageModels, load_stage_models
from engine.reinforce.reward import RewardContext, load_reward
from engine.reinforce.stage import (
    iteration_seed,
    iteration_texts,
    make_optimizer,
    roll_out,
    update,
)
from engine.train.builder import worker_device
from engine.train.checkpoint import Checkpointer
from engine.train.failures import FatalTrainingError, last_line
from engine.train.grpo import CodeLogprobs, PolicyObjective, code_logprobs
from engine.train.metrics import MetricsSender
from engine.train.objective import batch_to_device, build_talker, load_base_weights, set_trainable
from engine.train.parallelize import make_mesh, parallelize
from engine.train.stop import StopPoller


class Rollouts:
    """The rollout and scoring side (made a Ray actor by the driver)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.cfg = ReinforceConfig.from_dict(spec["reinforce"])
        voice = open_voice(spec["voice_dir"])
        run = Run(Path(spec["run_dir"]))
        self.models: StageModels = load_stage_models(voice, run, Path(spec["start"]),
                                                     spec["trainable"], "cpu", self.cfg.seed)
        self.reward = load_reward(RewardContext(voice, run.path, self.cfg, self.models,
                                                spec.get("asr")))
        self.params = dict(self.models.model.named_parameters())

    def load(self, weights: dict[str, torch.Tensor]) -> int:
        """The policy's weights as they are now (official names); how many were copied."""
        with torch.no_grad():
            for name, tensor in weights.items():
                self.params[name].copy_(tensor.to(self.params[name].dtype))
        return len(weights)

    def shards(self, it: int, texts: list[str], world: int) -> dict[str, Any]:
        """Iteration `it`'s renders from the loaded weights, scored; render i goes to rank
        i % world. {"figures": ..., "shards": [one per rank]}."""
        m = self.models
        rollout = roll_out(m.roller, self.reward, self.cfg, it, texts)
        out = []
        for rank in range(world):
            picked = list(range(rank, len(rollout.renders), world))
            renders = [rollout.renders[i] for i in picked]
            batch = m.roller.batch(texts, renders, "cpu")
            with torch.no_grad():
                old = code_logprobs(m.policy, batch).values
                ref = code_logprobs(m.reference, batch).values
            host = {k: v.numpy() for k, v in batch.items() if k in _LAYOUT_KEYS}
            out.append({"batch": host, "old": old.numpy(), "ref": ref.numpy(),
                        "adv": rollout.advantages[picked].numpy()})
        return {"figures": rollout.figures(self.cfg.group), "shards": out,
                "seed": iteration_seed(self.cfg, it)}


#: the collated layout a rank rebuilds its batch from (the gather rows are made again)
_LAYOUT_KEYS = ("text_ids", "codec_ids", "sub_codes", "target_mask", "frame_mask",
                "attention_mask", "x_vector", "speaker_pos")


def _policy(cfg: TrainConfig, loop_config: dict[str, Any]) -> tuple[Any, Any]:
    """The sharded policy, built as training builds its objective (on meta, sharded, then
    filled with the base weights); (policy, device)."""
    model_dir = Path(loop_config["model_dir"])
    device = worker_device(cfg, loop_config)
    policy = PolicyObjective(build_talker(model_dir, "meta"), cfg.model.subtalker_weight)
    set_trainable(policy, loop_config["trainable"])
    parallelize(policy, make_mesh(device), cfg.parallel, device)
    load_base_weights(policy, model_dir, device)
    return policy, device


def _full_weights(policy: Any) -> dict[str, torch.Tensor]:
    """The trainable weights, whole, on rank 0's host (every rank calls it: a collective;
    the other ranks get an empty dict)."""
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    full = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    return {k: v for k, v in full.items() if k in trainable}


def _broadcast(value: Any, group: Any) -> Any:
    box = [value]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _mean(value: float, device: Any) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t.item())


def actor_result(call: Any) -> Any:
    """`ray.get` of a call to the rollout actor; its failure is fatal (module doc)."""
    try:
        return ray.get(call)
    except Exception as exc:
        raise FatalTrainingError("rollout", f"The reinforce stage's rollouts failed: "
                                 f"{last_line(exc)}", "Run again with --debug for the "
                                 "actor's traceback.") from None


def _stage_resume(run_dir: Any, base: int) -> Any:
    """The stage's newest complete checkpoint in the run folder (a step above `base`, the
    run's highest when the stage began), or None."""
    newest = latest_checkpoint(run_dir)
    return newest if newest is not None and (step_of(newest) or 0) > base else None


@dataclass
class _StageWorker:
    """One worker's part of the stage: its rank, the sharded policy and its optimizer,
    the checkpointer, and where the stage's steps start in the run (`base`)."""

    rank: int
    world: int
    stage: ReinforceConfig
    sender: MetricsSender
    policy: Any
    device: Any
    optimizer: Any
    ckpt: Checkpointer
    base: int

    def resume(self, run_dir: Any, done: int) -> int:
        """The iterations done: the stage's own newest checkpoint's, where there is one
        (--resume, or a group Ray restarted: a restart may have saved later ones than the
        driver's resume_from), else `done`; its state is loaded."""
        resume = _stage_resume(run_dir, self.base)
        if resume is None:
            return done
        state = self.ckpt.load(resume, self.policy, self.optimizer, None)
        done = int(state["iteration"])
        if self.rank == 0:
            self.sender.log(f"reinforce stage: continuing after iteration {done} "
                            f"({resume.name})")
        return done

    def rollout(self, actor: Any, texts: list[str], it: int, stop: StopPoller
                ) -> tuple[dict[str, Any], bool]:
        """Iteration `it`'s rollout from the policy as it is now, and whether a Stop came:
        the weights to the actor from rank 0, the renders and the Stop to every rank."""
        weights = _full_weights(self.policy)
        handle = None
        if self.rank == 0:
            actor_result(actor.load.remote(weights))
            # the data itself to every rank (small: codes and their log-probabilities); an
            # object ref pickled by torch would not be borrowed properly by the others
            handle = [actor_result(actor.shards.remote(
                it, iteration_texts(texts, self.stage, it), self.world)), stop()]
        handle = _broadcast(handle, self.ckpt.group)
        return handle[0], bool(handle[1])

    def update(self, rollout: dict[str, Any]) -> dict[str, float]:
        """The policy updated on this rank's share; the step's terms, averaged over ranks."""
        mine = rollout["shards"][self.rank]
        batch = batch_to_device(mine["batch"], self.device)
        old, ref = (torch.from_numpy(mine[k]).to(self.device) for k in ("old", "ref"))
        adv = torch.from_numpy(mine["adv"]).to(self.device)
        policy = self.policy

        def logprobs(batch: dict[str, torch.Tensor] = batch) -> CodeLogprobs:
            out = policy(batch)
            return CodeLogprobs(out["values"], out["render"])

        terms = update(policy, self.optimizer, self.stage, logprobs, old, ref, adv)
        return {"reinforce/kl": _mean(float(terms.kl), self.device),
                "reinforce/clipped": _mean(float(terms.clipped), self.device),
                "reinforce/loss": _mean(float(terms.loss.detach()), self.device)}

    def save(self, n: int, extra: dict[str, Any]) -> None:
        self.ckpt.save(self.base + n, self.policy, self.optimizer, None, {"iteration": n},
                       extra={**extra, "iteration": n})
        if self.rank == 0:
            self.sender.send("state", {"state": "checkpoint", "step": self.base + n,
                                       "detail": f"iteration {n}"})


def _start_worker(loop_config: dict[str, Any]) -> _StageWorker:
    """The worker announced, its policy sharded and the start checkpoint's weights in it
    (the training optimizer's state is not the stage's)."""
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    cfg = TrainConfig.from_dict(loop_config["config"])
    stage = ReinforceConfig.from_dict(loop_config["reinforce"])
    torch.set_num_threads(cfg.parallel.cpu_threads_per_worker)
    sender = MetricsSender(loop_config.get("queue"), rank)
    # the launcher learns the pids (and counts a second start of rank 0 as a restart)
    sender.send("state", {"state": "worker_started", "detail": f"rank {rank}", "rank": rank,
                          "pid": os.getpid()})
    policy, device = _policy(cfg, loop_config)
    optimizer = make_optimizer(policy, stage)
    ckpt = Checkpointer(loop_config["run_dir"], rank, world)
    ckpt.load(loop_config["start"], policy, make_optimizer(policy, stage), None)
    return _StageWorker(rank, world, stage, sender, policy, device, optimizer, ckpt,
                        int(loop_config["base"]))


def reinforce_loop(loop_config: dict[str, Any]) -> None:
    """Every worker's entry point (given to training's launcher as its loop)."""
    w = _start_worker(loop_config)
    stop = StopPoller(loop_config.get("stop_flag"))
    stage = w.stage
    done = w.resume(loop_config["run_dir"], int(loop_config["done"]))
    actor, texts = loop_config["actor"], loop_config["texts"]
    extra = dict(loop_config["state"])  # what trainer.json says of the stage
    saved = done
    for it in range(done, int(stage.iterations)):
        rollout, stopping = w.rollout(actor, texts, it, stop)
        terms = w.update(rollout)
        n = it + 1
        if w.rank == 0:
            values = {f"reinforce/{k}": v for k, v in rollout["figures"].items()}
            w.sender.send("reinforce", {"step": w.base + n, "iteration": n, **values,
                                        **terms})
        if n % int(stage.checkpoint_every) == 0 or n == stage.iterations or stopping:
            w.save(n, extra)
            saved = n
        if stopping:
            break
    if w.rank == 0 and saved:
        w.sender.log(f"reinforce stage: iteration {saved} saved")
    w.ckpt.close()
