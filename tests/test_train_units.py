"""train-ray pieces without Ray: schedule, checkpoints, the memory plan, fail-fast checks.

The sharded parts run in two real processes with a gloo process group and
FSDP2 applied by train-core's `parallelize` to the tiny model's objective.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from engine.core.errors import InputError, ModelError
from tests.helpers.voices import voice_with_clips


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_lr_schedule_warmup_then_cosine_to_floor() -> None:
    from engine.train.trainer import lr_lambda

    f = lr_lambda(warmup=4, total=20, schedule="cosine", min_ratio=0.1)
    assert [round(f(s), 3) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    values = [f(s) for s in range(4, 21)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # decays
    assert f(20) == pytest.approx(0.1)
    assert lr_lambda(0, 10, "constant", 0.1)(7) == 1.0


# -- two-rank FSDP worker (spawned) -------------------------------------------------------

def _stepped_objective(rank: int, world: int, model_dir: str) -> tuple[Any, Any, Any, int]:
    """The tiny objective sharded over the group, one real optimizer step taken on every
    shard (random gradients, no data); (objective, optimizer, scheduler, state bytes)."""
    import torch

    from engine.config.train import TrainConfig
    from engine.train.metrics import model_state_bytes
    from engine.train.objective import build_objective, load_base_weights
    from engine.train.parallelize import make_mesh, parallelize
    from engine.train.trainer import lr_lambda

    cfg = TrainConfig().replace(parallel={"workers": world}, data={"batch_size": world})
    device = torch.device("cpu")
    obj = build_objective(model_dir, cfg.model, device="meta")
    parallelize(obj, make_mesh(device), cfg.parallel, device)
    load_base_weights(obj, model_dir, device)
    params = [p for p in obj.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(2, 10, "cosine", 0.1))
    g = torch.Generator().manual_seed(rank)
    for p in params:
        local = torch.randn(p.to_local().shape, generator=g)
        p.grad = p.new_zeros(p.shape)
        p.grad.to_local().copy_(local)
    opt.step()
    sched.step()
    return obj, opt, sched, model_state_bytes(obj, opt)


def _checkpoint_round_trip(rank: int, world: int, out_dir: str, obj: Any, opt: Any,
                           sched: Any) -> dict[str, Any]:
    """Save, wreck everything the checkpoint must restore, load; what came back, then two
    more saves and the prune."""
    import torch

    from engine.train.checkpoint import Checkpointer

    ckpt = Checkpointer(Path(out_dir) / "run", rank, world, keep=2)
    torch.manual_seed(1234 + rank)
    path = ckpt.save(1, obj, opt, sched, {"epoch": 0, "position": 1})
    before = {n: p.to_local().clone() for n, p in obj.named_parameters()}
    exp_avg = {i: s["exp_avg"].to_local().clone() for i, s in enumerate(opt.state.values())}
    expect_rand = torch.rand(3)
    with torch.no_grad():
        for p in obj.parameters():
            p.to_local().add_(1.0)
    for s in opt.state.values():
        s["exp_avg"].to_local().zero_()
    sched.step()
    sched.step()
    torch.manual_seed(999)
    state = ckpt.load(path, obj, opt, sched)
    restored = all(torch.equal(before[n], p.to_local()) if p.requires_grad else True
                   for n, p in obj.named_parameters())
    opt_ok = all(torch.equal(exp_avg[i], s["exp_avg"].to_local())
                 for i, s in enumerate(opt.state.values()))
    rng_ok = torch.equal(torch.rand(3), expect_rand)
    ckpt.save(2, obj, opt, sched, {"epoch": 0, "position": 2})
    ckpt.save(3, obj, opt, sched, {"epoch": 0, "position": 3})
    pruned = [p.name for p in ckpt.prune()]
    ckpt.close()
    return {"restored": restored, "opt_ok": opt_ok, "rng_ok": rng_ok,
            "sched_epoch": sched.last_epoch, "state": state, "pruned": pruned}


def _rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        obj, opt, sched, measured = _stepped_objective(rank, world, model_dir)
        result = {"measured": measured,
                  **_checkpoint_round_trip(rank, world, out_dir, obj, opt, sched)}
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result, default=str))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_result(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> dict[int, dict[str, Any]]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("two_rank")
    mp.spawn(_rank_main, args=(2, _free_port(), str(tiny_model_dir), str(out)), nprocs=2,
             join=True)
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}


def test_checkpoint_restores_model_optimizer_scheduler_rng_exactly(
        two_rank_result: dict[int, dict[str, Any]]) -> None:
    for rank, res in two_rank_result.items():
        assert res["restored"], f"rank {rank}: parameters differ after load"
        assert res["opt_ok"], f"rank {rank}: AdamW state differs after load"
        assert res["rng_ok"], f"rank {rank}: RNG stream differs after load"
        assert res["sched_epoch"] == 1
        assert res["state"]["data"] == {"epoch": 0, "position": 1}
    # keep=2: of steps 1, 2, 3 only the oldest goes
    assert two_rank_result[0]["pruned"] == ["checkpoint_step_0000001"]


def test_plan_predicts_sharded_model_state_exactly(
        two_rank_result: dict[int, dict[str, Any]], tiny_model_dir: Path) -> None:
    from engine.config.train import TrainConfig
    from engine.train.plan import make_plan

    cfg = TrainConfig().replace(parallel={"workers": 2}, data={"batch_size": 2})
    plan = make_plan(tiny_model_dir, cfg, device="cpu", free=[1 << 40], seq_len=100, frames=60)
    m0 = two_rank_result[0]["measured"]
    m1 = two_rank_result[1]["measured"]
    # rank 0 holds the larger chunk of every odd-sized dimension: the plan predicts rank 0
    assert plan.params == m0["params"]
    assert plan.grads == m0["grads"]
    assert plan.optimizer == m0["optimizer"]
    assert m1["total"] <= m0["total"]
    # and the two shards together are the unsharded model (nothing duplicated)
    single = make_plan(tiny_model_dir, cfg.replace(parallel={"workers": 1},
                                                   data={"batch_size": 1}),
                       device="cpu", free=[1 << 40], seq_len=100, frames=60)
    assert m0["params"] + m1["params"] == single.params


def test_plan_advises_when_it_does_not_fit(tiny_model_dir: Path) -> None:
    import re

    from engine.config.train import TrainConfig
    from engine.train.plan import make_plan

    cfg = TrainConfig().replace(parallel={"workers": 1}, data={"batch_size": 8})
    free = int(3.5 * (1 << 30))
    plan = make_plan(tiny_model_dir, cfg, device="cuda", free=[free],
                     seq_len=1500, frames=1200, capability=(9, 0))
    assert not plan.fits
    text = "\n".join(plan.advice)
    assert "(--batch-size 4 --grad-accum 2)." in text
    assert [(c.path, c.value) for c in plan.changes][:2] == [("data.batch_size", 4),
                                                             ("data.grad_accum", 2)]
    # the tiny model's memory is mostly logits: checkpointing layers saves too little to fit
    assert "activation checkpointing" not in text
    assert "DOES NOT FIT" in plan.table()
    # every recommended setting fits on its own: its figure is within the free memory
    figures = [float(x) for x in re.findall(r"about ([0-9.]+) GiB per (?:worker|GPU)", text)]
    assert figures and all(f * (1 << 30) <= free for f in figures), text
    # nothing fits alone: the advice says so instead of recommending what does not fit
    tight = make_plan(tiny_model_dir, cfg, device="cuda", free=[1 << 30], seq_len=1500,
                      frames=1200, capability=(9, 0))
    assert "No single change fits" in "\n".join(tight.advice) and tight.changes == []
    assert not re.findall(r"about ([0-9.]+) GiB per", "\n".join(tight.advice))


# -- fail fast, before any cluster starts ---------------------------------------------------


def test_too_little_data_fails_in_one_sentence(tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine.train.driver import train

    voice = voice_with_clips(tmp_path, 2, 3.0)
    with pytest.raises(InputError) as err:
        train(voice, str(tiny_model_dir), workers=2, dry_run=True)
    assert "training needs at least" in err.value.message
    assert err.value.message.count(". ") == 0  # one sentence


def test_more_workers_than_gpus_fails(tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine.train.driver import train
    from engine.train.resolve import detect_gpus

    voice = voice_with_clips(tmp_path, 8, 4.0)
    gpus = detect_gpus(None)
    with pytest.raises(InputError) as err:
        train(voice, str(tiny_model_dir), workers=gpus + 1, use_gpu=True, dry_run=True)
    assert err.value.message == (f"You asked for {gpus + 1} worker{'s' if gpus else ''} "
                                 f"but this machine has {gpus} GPU{'' if gpus == 1 else 's'}.")


def test_base_must_be_qwen3_tts_base(tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine.train.driver import train

    voice = voice_with_clips(tmp_path, 8, 4.0)
    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError) as err:
        train(voice, str(other), dry_run=True)
    assert "not Qwen3-TTS" in err.value.message


def test_dry_run_plans_with_presets(tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine.train.driver import train

    voice = voice_with_clips(tmp_path, 8, 4.0)
    out = train(voice, str(tiny_model_dir), workers=2, dry_run=True)
    cfg = out["config"]
    assert cfg["parallel"]["workers"] == 2
    assert cfg["optim"]["lr"] == 1e-3  # the tiny model's preset
    assert cfg["run"]["epochs"] == 20.0  # under 10 minutes of data
    assert 2 <= cfg["data"]["batch_size"] <= 7
    assert out["plan"]["fits"]
    assert "Predicted memory per CPU worker" in out["summary"]


def test_not_enough_memory_fails_fast(tmp_path: Path, tiny_model_dir: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.train import driver, plan

    voice = voice_with_clips(tmp_path, 8, 4.0)
    monkeypatch.setattr(plan, "host_available_memory", lambda: 64 << 20)
    with pytest.raises(InputError) as err:
        driver.train(voice, str(tiny_model_dir), workers=2)
    assert err.value.message.startswith("Training will not fit")


def _widened_model_dir(tiny: Path, out: Path) -> Path:
    """The tiny model's folder with real 0.6B layer widths (1 layer each, small text vocab)."""
    cfg = json.loads((tiny / "config.json").read_text())
    talker = cfg["talker_config"]
    widths = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 1}
    talker.update(widths)
    talker.setdefault("rope_scaling", {})["mrope_section"] = [24, 20, 20]
    talker["code_predictor_config"].update(widths)
    for sub in (talker, talker["code_predictor_config"]):
        if "layer_types" in sub:
            sub["layer_types"] = ["full_attention"]
    cfg["speaker_encoder_config"]["enc_dim"] = 1024
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_plan_activation_estimate_matches_saved_tensors(tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    """The activation term against what autograd really keeps for backward (real widths)."""
    import numpy as np
    import torch

    from engine.data.layout import LayoutIds, build_sequence, collate
    from engine.train.objective import build_objective
    from engine.train.plan import estimate_activations
    from tests.helpers.batches import saved_bytes

    model_dir = _widened_model_dir(tiny_model_dir, tmp_path / "wide")
    cfg = json.loads((model_dir / "config.json").read_text())
    torch.manual_seed(0)
    obj = build_objective(model_dir, None, device="cpu")  # random weights are enough
    ids = LayoutIds.from_config(cfg)
    rng = np.random.default_rng(0)
    frames, clips = 60, 2
    seqs = [build_sequence(ids, [1, 2, 3], rng.integers(10, 500, 12).tolist(),
                           rng.integers(0, 2048, (frames, 16))) for _ in range(clips)]
    batch = collate(seqs, ids)
    batch["x_vector"] = rng.standard_normal((clips, 1024)).astype("float32")
    measured = saved_bytes(obj, batch)
    seq_len = int(batch["text_ids"].shape[1])
    predicted = estimate_activations(cfg, clips, seq_len, frames, 4, checkpointing=False)
    assert 0.85 * measured <= predicted <= 1.3 * measured, (predicted, measured)


def test_batch_larger_than_the_data_fails_before_any_cluster(tmp_path: Path,
                                                             tiny_model_dir: Path) -> None:
    from engine.train.driver import train

    voice = voice_with_clips(tmp_path, 10, 4.0)  # 8 train + 2 validation clips
    with pytest.raises(InputError) as err:
        train(voice, str(tiny_model_dir), workers=2, batch_size=9, dry_run=True)
    assert err.value.message == ("Only 8 training clips, fewer than one optimizer step "
                                 "needs (9).")
    out = train(voice, str(tiny_model_dir), workers=2, dry_run=True)
    assert out["config"]["data"]["batch_size"] == 4  # preset, fits the 8 clips


def test_cpu_runs_step_adamw_with_the_fused_cpu_kernel_as_foreach_would() -> None:
    """CPU runs and the host shards of CPU offload take torch's fused CPU AdamW (one pass
    per tensor) instead of foreach (issue 32: its ~ten passes over every trainable
    tensor were a large share of a CPU step); the step is foreach's to float32 rounding."""
    import torch

    from engine.config.train import TrainConfig
    from engine.train.plan import optimizer_kind
    from engine.train.trainer import make_optimizer

    assert (optimizer_kind("cpu"), optimizer_kind("cpu", offload=True),
            optimizer_kind("cuda")) == ("fused", "fused", "fused")
    steps = {}
    for offload in (None, False, True):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(64, 32)), torch.nn.Parameter(torch.randn(32))]
        if offload is None:  # the reference: foreach, as CPU runs stepped before
            o = TrainConfig().optim
            opt = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                    weight_decay=o.weight_decay, foreach=True)
        else:
            cfg = TrainConfig().replace(parallel={"cpu_offload": offload})
            opt = make_optimizer(params, cfg, torch.device("cuda" if offload else "cpu"))
            assert opt.defaults.get("fused") is True
        for _ in range(3):
            for p in params:
                p.grad = torch.sin(p.detach() * 3.0)
            opt.step()
        steps[offload] = [p.detach().clone() for p in params]
    for run in (False, True):
        for a, b in zip(steps[None], steps[run], strict=True):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
