"""A sharded step on 2 gloo processes equals a single-process step.

Two real processes (torch.multiprocessing, gloo, CPU) each build the
objective on the meta device, `parallelize` it, load the base weights into
their shards and take AdamW steps on their half of a batch; a single process
takes the same steps on the whole batch. Losses and the updated parameters
(gathered to a full state dict) must agree. Half the batch per rank is split
unevenly on purpose, so token-count weighting is exercised too.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config.train import ModelConfig, ParallelConfig
from engine.train.objective import (
    build_objective,
    full_state_dict,
    load_base_weights,
    read_talker_weights,
    trainable_parameters,
)
from engine.train.parallelize import make_mesh, parallelize
from tests.helpers.batches import layout_batch, layout_sequences

# numeric parity: sharded FSDP2 against one process: different reduction orders.
# packaging/run_tests.sh runs these again under other CPU kernel dispatches.
pytestmark = pytest.mark.parity

STEPS = 2
LR = 1e-3
RANK_SPLIT = ([0, 1, 2], [3])  # 3 clips on rank 0, 1 long one on rank 1


def _full_grads(objective: Any) -> dict[str, torch.Tensor]:
    """Every trainable parameter's whole gradient (gathered from the shards: a
    collective, so every rank calls it in the same order)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in objective.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            out[name] = g.detach().clone()
    return out


def _train(objective: Any, batch: dict[str, torch.Tensor],
           all_sum: Any) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """STEPS AdamW steps; returns the losses and each step's clipped gradients."""
    opt = torch.optim.AdamW(trainable_parameters(objective), lr=LR, foreach=True)
    losses, grads = [], []
    for _ in range(STEPS):
        out = objective(batch)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(trainable_parameters(objective), 1.0)
        grads.append(_full_grads(objective))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sums = all_sum(torch.stack([out["talker_sum"], out["subtalker_sum"],
                                    out["talker_tokens"], out["subtalker_tokens"]]))
        losses.append(float(sums[0] / sums[2] + 0.3 * sums[1] / sums[3]))
    return losses, grads


#: micro-steps per optimizer step in the accumulation runs
ACCUM = 2


def _count_all_gathers(objective: Any) -> list[int]:
    """A counter of FSDP2's all-gathers on this rank: the default collective, counted."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    from engine.train.parallelize import fsdp_units

    count = [0]

    class Counting(DefaultAllGather):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return super().__call__(*args, **kwargs)

    for unit in fsdp_units(objective):
        unit.set_custom_all_gather(Counting())
    return count


def _train_accumulated(objective: Any, batch: dict[str, torch.Tensor], all_sum: Any,
                       keep: bool) -> tuple[list[float], list[dict[str, torch.Tensor]],
                                             dict[str, int]]:
    """STEPS AdamW steps of ACCUM micro-steps on the same batch (each loss / ACCUM, so
    each step's gradient is `_train`'s), reducing on the last micro-step only, in the
    worker's order of switches; also the gathered parameter bytes: held after the first
    micro-step's backward, and the most at any time in backward (sampled whenever
    autograd unpacks a saved tensor, where backward prefetch gathers ahead)."""
    from engine.train.metrics import gathered_param_bytes
    from engine.train.parallelize import set_gradient_sync, set_keep_gathered

    opt = torch.optim.AdamW(trainable_parameters(objective), lr=LR, foreach=True)
    losses, grads, held, peak = [], [], -1, [0]

    def unpack(t: torch.Tensor) -> torch.Tensor:
        peak[0] = max(peak[0], gathered_param_bytes(objective))
        return t

    for _ in range(STEPS):
        sums = None
        for i in range(ACCUM):
            last = i == ACCUM - 1
            set_gradient_sync(objective, last)
            if keep:
                set_keep_gathered(objective, True, last)
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
                out = objective(batch)
            (out["loss"] / ACCUM).backward()
            if held < 0:
                held = gathered_param_bytes(objective)
            step = torch.stack([out["talker_sum"], out["subtalker_sum"],
                                out["talker_tokens"], out["subtalker_tokens"]]).detach()
            sums = step if sums is None else sums + step
        if keep:
            set_keep_gathered(objective, False)
        torch.nn.utils.clip_grad_norm_(trainable_parameters(objective), 1.0)
        grads.append(_full_grads(objective))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sums = all_sum(sums)
        losses.append(float(sums[0] / sums[2] + 0.3 * sums[1] / sums[3]))
    return losses, grads, {"held": held, "peak": peak[0]}


# Sharded and single-process runs reduce in a different order (per-rank sums,
# then gloo's all-reduce), so they agree to float32 rounding, not bit for bit,
# and the rounding depends on the CPU's kernels (AVX2, AVX-512, AMX).
#: a gradient element may differ by this fraction of its tensor's largest element
GRAD_RTOL = 1e-5
#: torch.optim.AdamW's default epsilon (what _train uses)
ADAM_EPS = 1e-8


def assert_grads_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    """The property that sharding must keep: the same gradients, to rounding.
    (Adam is invariant to a gradient's scale, so the weights alone would not
    catch e.g. a gradient summed instead of averaged over ranks.)"""
    assert set(got) == set(ref)
    for name, g in ref.items():
        scale = float(g.abs().max())
        torch.testing.assert_close(got[name], g, rtol=1e-4, atol=GRAD_RTOL * scale + 1e-12,
                                   msg=name)


def assert_adamw_weights_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                               ref_grads: list[dict[str, torch.Tensor]]) -> None:
    """Weights after STEPS AdamW steps from equal starting weights, bounded by
    what AdamW can legitimately make of gradients that agree to rounding.

    AdamW's step for an element is about lr * g / (|g| + eps): a gradient
    difference d moves it by up to lr * eps * d / (|g| - d + eps)^2, which is
    nothing for ordinary gradients but up to a whole step (lr) for a gradient
    near eps. So each element gets that bound (per step, at most 2 lr), with d
    ten times the gradient tolerance (the second step's gradients also see the
    first step's difference), on top of a tight float32 tolerance.
    """
    for name, value in ref.items():
        if name not in ref_grads[0]:  # frozen: no optimizer ever touched it
            assert torch.equal(got[name], value), name
            continue
        steps = torch.stack([g[name].abs() for g in ref_grads])
        d = 10 * GRAD_RTOL * float(steps.amax())
        smallest = (steps.amin(0) - d).clamp_min(0)
        amplified = (LR * ADAM_EPS * d / (smallest + ADAM_EPS) ** 2).clamp_max(2 * LR)
        # untouched rows (embeddings of unused ids) get exact zeros: weight decay alone
        amplified[steps.amax(0) == 0] = 0
        allowed = 2e-6 + 1e-4 * value.abs() + STEPS * amplified
        excess = (got[name] - value).abs() - allowed
        assert float(excess.max()) <= 0, (
            f"{name}: differs by {float((got[name] - value).abs().max()):.3g}, "
            f"{int((excess > 0).sum())} elements beyond AdamW's bound")


#: sharded configurations run in one spawn (process start-up dominates the cost)
VARIANTS = {
    "plain": ParallelConfig(workers=2),
    "activation_checkpointing": ParallelConfig(workers=2, activation_checkpointing=True),
    "bf16": ParallelConfig(workers=2, precision="bf16"),
    # what "auto" picks on GPUs older than compute capability 8.0
    "fp16": ParallelConfig(workers=2, precision="fp16"),
    # only the code predictor trains: frozen talker layers are whole FSDP units
    "code_predictor": ParallelConfig(workers=2),
}
TRAINABLE = {"code_predictor": "code_predictor"}


def _all_sum(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    t = t.clone()
    dist.all_reduce(t)
    return t


def _sharded(model_dir: str, mesh: Any, cfg: ParallelConfig, trainable: str = "talker"
             ) -> Any:
    """The tiny objective built on meta, sharded over `mesh` and filled with the base."""
    device = torch.device("cpu")
    objective = build_objective(model_dir, ModelConfig(trainable=trainable), device="meta")
    parallelize(objective, mesh, cfg, device)
    load_base_weights(objective, model_dir, device)
    return objective


def _variant(objective: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One variant trained on the rank's batch: its losses, gradients, state and dtypes."""
    from torch.distributed.tensor import DTensor

    from engine.train.metrics import model_state_bytes

    # runs after FSDP's own pre-forward hook: sees the batch as forward gets it
    seen: list[torch.dtype] = []
    objective.register_forward_pre_hook(
        lambda _m, args, seen=seen: seen.append(args[0]["talker_norm"].dtype))
    local = sum(p.to_local().numel() for p in objective.parameters()
                if isinstance(p, DTensor))
    total = sum(p.numel() for p in objective.parameters())
    losses, grads = _train(objective, batch, _all_sum)
    # the run's state metric, with the frozen text embedding kept gathered
    state = model_state_bytes(objective)["params"]
    # the state dict reshards every unit (the frozen one kept gathered too), so
    # the parameters read after it are the fp32 shards the optimizer updates
    sd = full_state_dict(objective)
    dtypes = {str(p.dtype) for p in objective.parameters()}
    return {"losses": losses, "sd": sd, "state": state, "local": local, "total": total,
            "dtypes": sorted(dtypes), "norm_dtype": str(seen[0]), "grads": grads[0]}


def _accumulation(model_dir: str, mesh: Any, batch: dict[str, torch.Tensor]
                  ) -> dict[str, Any]:
    """Gradient accumulation: the whole gradients FSDP keeps without reduction, and
    ACCUM micro-steps with the parameters kept gathered between them or not."""
    from engine.train.metrics import model_state_bytes, unsharded_grad_bytes
    from engine.train.parallelize import set_gradient_sync

    results: dict[str, Any] = {}
    objective = _sharded(model_dir, mesh, ParallelConfig(workers=2))
    set_gradient_sync(objective, False)
    objective(batch)["loss"].backward()
    results["accum_last_bytes"] = unsharded_grad_bytes(objective)
    objective.zero_grad(set_to_none=True)
    set_gradient_sync(objective, True)
    objective(batch)["loss"].backward()
    results["accum_every_bytes"] = model_state_bytes(objective)["grads"]
    results["accum_every_unsharded"] = unsharded_grad_bytes(objective)
    for keep in (True, False):
        objective = _sharded(model_dir, mesh, ParallelConfig(workers=2))
        gathers = _count_all_gathers(objective)
        losses, grads, held = _train_accumulated(objective, batch, _all_sum, keep)
        results[f"accum_keep_{keep}"] = {
            "losses": losses, "grads": grads, "sd": full_state_dict(objective),
            "gathers": gathers[0], **held}
    return results


def _rank_main(rank: int, world: int, model_dir: str, out: str, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = make_mesh(torch.device("cpu"))
        seqs, ids, xv = layout_sequences(Path(model_dir))
        batch = layout_batch(seqs, ids, xv, RANK_SPLIT[rank], world)
        results: dict[str, Any] = {
            name: _variant(_sharded(model_dir, mesh, cfg, TRAINABLE.get(name, "talker")), batch)
            for name, cfg in VARIANTS.items()}
        results.update(_accumulation(model_dir, mesh, batch))
        if rank == 0:
            torch.save(results, out)
        # nobody tears gloo down while the other rank still talks to it
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _single(model_dir: Path, trainable: str) -> dict[str, Any]:
    objective = build_objective(model_dir, ModelConfig(trainable=trainable), device="meta")
    parallelize(objective, None, ParallelConfig(), "cpu")
    load_base_weights(objective, model_dir, "cpu")
    seqs, ids, xv = layout_sequences(model_dir)
    losses, grads = _train(objective, layout_batch(seqs, ids, xv, [0, 1, 2, 3], 1), lambda t: t)
    return {"losses": losses, "sd": full_state_dict(objective), "grads": grads}


@pytest.fixture(scope="module")
def single(tiny_model_dir: Path) -> dict[str, Any]:
    return _single(tiny_model_dir, "talker")


def test_meta_build_loads_exactly_the_base_weights(tiny_model_dir: Path) -> None:
    """Meta build + load gives the official model's talker, buffers included."""
    from engine.model.official import import_qwen_tts

    qt = import_qwen_tts()
    official = qt.Qwen3TTSModel.from_pretrained(str(tiny_model_dir), dtype=torch.float32,
                                                attn_implementation="sdpa").model.talker
    objective = build_objective(tiny_model_dir, device="meta")
    load_base_weights(objective, tiny_model_dir, "cpu")
    ours = dict(objective.talker.named_buffers())
    for name, buf in official.named_buffers():
        torch.testing.assert_close(ours[name], buf, rtol=0, atol=0)
    weights = read_talker_weights(tiny_model_dir)
    for name, p in objective.named_parameters():
        assert torch.equal(p, weights[name])
    assert len(weights) == len(dict(objective.named_parameters()))
    # text embedding frozen by default, everything else in the talker trains
    frozen = {n for n, p in objective.named_parameters() if not p.requires_grad}
    assert frozen == {"talker.model.text_embedding.weight"}


@pytest.fixture(scope="module")
def sharded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("sharded") / "rank0.pt"
    mp.spawn(_rank_main, args=(2, str(tiny_model_dir), str(out), _free_port()),
             nprocs=2, join=True)
    return torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain", "activation_checkpointing"])
def test_sharded_step_equals_single_process(sharded: dict[str, Any], single: dict[str, Any],
                                            variant: str) -> None:
    got = sharded[variant]
    assert got["losses"] == pytest.approx(single["losses"], rel=1e-5)
    # the loss moved: the steps really trained
    assert got["losses"][-1] < got["losses"][0]
    assert set(got["sd"]) == set(single["sd"])
    assert_grads_close(got["grads"], single["grads"][0])
    assert_adamw_weights_close(got["sd"], single["sd"], single["grads"])
    # each rank holds half of every sharded parameter (up to padding of odd dims)
    assert got["local"] == pytest.approx(got["total"] / 2, rel=0.01)
    # after training, with the frozen text embedding gathered whole on the module, the
    # state metric still counts each rank's fp32 shards
    assert got["state"] == 4 * got["local"]


@pytest.mark.slow
def test_bf16_mixed_precision_keeps_fp32_master_weights(sharded: dict[str, Any],
                                                        single: dict[str, Any],
                                                        tiny_model_dir: Path) -> None:
    got = sharded["bf16"]
    assert got["dtypes"] == ["torch.float32"]  # master weights (and so AdamW) stay fp32
    # the loss normalisers reach forward unrounded (not cast to bf16 with the weights)
    assert got["norm_dtype"] == "torch.float32"
    # bf16 compute: close to the fp32 losses, not equal
    assert got["losses"] == pytest.approx(single["losses"], rel=2e-2)
    assert got["losses"] != single["losses"]
    assert got["losses"][-1] < got["losses"][0]
    # updates landed in the fp32 master weights and track the fp32 run's updates
    key = "talker.codec_head.weight"
    base = read_talker_weights(tiny_model_dir)[key].float()
    ours, ref = got["sd"][key] - base, single["sd"][key] - base
    assert ours.abs().max() > 0.5 * LR
    assert torch.nn.functional.cosine_similarity(ours.flatten(), ref.flatten(), dim=0) > 0.9


@pytest.mark.slow
def test_fp16_mixed_precision_trains_fp32_masters(sharded: dict[str, Any],
                                                  single: dict[str, Any]) -> None:
    got = sharded["fp16"]
    assert got["dtypes"] == ["torch.float32"]
    assert got["norm_dtype"] == "torch.float32"
    assert got["losses"] == pytest.approx(single["losses"], rel=2e-2)
    assert got["losses"] != single["losses"]
    assert got["losses"][-1] < got["losses"][0]


def test_activation_checkpointing_recomputes_layers(tiny_model_dir: Path) -> None:
    objective = build_objective(tiny_model_dir, device="meta")
    parallelize(objective, None, ParallelConfig(activation_checkpointing=True), "cpu")
    load_base_weights(objective, tiny_model_dir, "cpu")
    calls = []
    layer = objective.talker.model.layers[0]
    forward = layer.forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return forward(*args, **kwargs)

    layer.forward = counting
    seqs, ids, xv = layout_sequences(tiny_model_dir)
    out = objective(layout_batch(seqs, ids, xv, [0, 1], 1))
    assert len(calls) == 1
    out["loss"].backward()
    assert len(calls) == 2  # run again in backward instead of keeping activations


def test_world_of_one_is_sharded_and_equal(tiny_model_dir: Path, single: dict[str, Any],
                                           tmp_path: Path) -> None:
    """One worker (the single-GPU case) still goes through fully_shard, with equal results."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        objective = build_objective(tiny_model_dir, device="meta")
        parallelize(objective, make_mesh(torch.device("cpu")), ParallelConfig(), "cpu")
        load_base_weights(objective, tiny_model_dir, "cpu")
        assert all(isinstance(p, DTensor) for p in objective.parameters())
        seqs, ids, xv = layout_sequences(tiny_model_dir)
        losses, grads = _train(objective, layout_batch(seqs, ids, xv, [0, 1, 2, 3], 1),
                               lambda t: t)
        sd = full_state_dict(objective)
    finally:
        dist.destroy_process_group()
    assert losses == pytest.approx(single["losses"], rel=1e-5)
    assert_grads_close(grads[0], single["grads"][0])
    assert_adamw_weights_close(sd, single["sd"], single["grads"])


def test_a_world_of_one_reduces_gradients_without_copying_them(tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    """One CPU rank: each unit's gradient "reduce-scatter" gets its input buffer back as
    the output (no full-gradient copy), the sharded gradients are views of it, and the
    next step copies into the same buffer once those gradients are gone, never while one
    is held (two backwards accumulating); the accumulated gradients and two AdamW steps
    are bit for bit what FSDP's own reduction (fresh buffers, a copy) gives."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    from engine.train.parallelize import OneRankReduce, fsdp_units

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    runs: dict[str, Any] = {}
    try:
        seqs, ids, xv = layout_sequences(tiny_model_dir)
        batch = layout_batch(seqs, ids, xv, [0, 1, 2, 3], 1)
        for comm in ("ours", "fsdp"):
            objective = build_objective(tiny_model_dir, device="meta")
            parallelize(objective, make_mesh(torch.device("cpu")), ParallelConfig(), "cpu")
            load_base_weights(objective, tiny_model_dir, "cpu")
            handed: list[torch.Tensor] = []
            for unit in fsdp_units(objective):
                reduce = unit._get_fsdp_state()._fsdp_param_group._reduce_scatter_comm
                if comm == "fsdp":
                    unit.set_custom_reduce_scatter(DefaultReduceScatter())
                    continue
                assert isinstance(reduce, OneRankReduce)
                allocate = reduce.allocate

                def spy(size: Any, allocate: Any = allocate, handed: list = handed,
                        **kw: Any) -> torch.Tensor:
                    handed.append(allocate(size, **kw))
                    return handed[-1]

                reduce.allocate = spy

            def backward(objective: Any = objective, handed: list = handed) -> list[int]:
                """One backward; the storages of the buffers its reductions copied into."""
                del handed[:]
                objective(batch)["loss"].backward()
                inputs = handed[0::2]
                # input, then output: the output is the input buffer itself
                assert all(out is inp for inp, out in zip(inputs, handed[1::2], strict=True))
                return [t.untyped_storage().data_ptr() for t in inputs]

            first = backward()
            if comm == "ours":
                assert len(first) >= 4  # the layers' units and the root
                grads = [p.grad.to_local() for p in objective.parameters()
                         if p.grad is not None]
                assert grads and all(g.untyped_storage().data_ptr() in first for g in grads)
            # a second backward adds to the gradients held: fresh buffers to add from
            held = backward()
            accumulated = _full_grads(objective)
            objective.zero_grad(set_to_none=True)
            again = backward()  # the gradients are gone: the first step's buffers again
            objective.zero_grad(set_to_none=True)
            if comm == "ours":
                assert not set(held) & set(first) and again == first
            losses, grads = _train(objective, batch, lambda t: t)
            runs[comm] = (accumulated, losses, grads, full_state_dict(objective))
    finally:
        dist.destroy_process_group()
    (acc, losses, grads, sd), (ref_acc, ref_losses, ref_grads, ref_sd) = (runs["ours"],
                                                                         runs["fsdp"])
    assert acc.keys() == ref_acc.keys() and all(torch.equal(acc[k], v)
                                                for k, v in ref_acc.items())
    assert losses == ref_losses
    for got, ref in zip(grads, ref_grads, strict=True):
        assert all(torch.equal(got[k], v) for k, v in ref.items())
    assert all(torch.equal(sd[k], v) for k, v in ref_sd.items())


def test_a_frozen_unit_stays_gathered_until_a_state_dict_reshards_it(tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    """The frozen text embedding is gathered at the first forward and kept: a change made
    to its shard behind FSDP's back is not seen by the next step (no gather), while a
    trained embedding ("talker+text") is gathered afresh every step. A state-dict load
    (the checkpoint's resume) reshards it, so the next forward gathers what was loaded."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        set_model_state_dict,
    )

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    seen: dict[str, list[torch.Tensor]] = {}
    try:
        seqs, ids, xv = layout_sequences(tiny_model_dir)
        batch = layout_batch(seqs, ids, xv, [0, 1], 1)
        for trainable in ("talker", "talker+text"):
            objective = build_objective(tiny_model_dir, ModelConfig(trainable=trainable),
                                        device="meta")
            parallelize(objective, make_mesh(torch.device("cpu")), ParallelConfig(), "cpu")
            load_base_weights(objective, tiny_model_dir, "cpu")
            embedding = objective.talker.model.text_embedding
            shard = embedding.weight.to_local()
            rows = seen[trainable] = []
            embedding.register_forward_hook(lambda _m, _a, out, rows=rows:
                                            rows.append(out.detach().clone()))

            def step(objective: Any = objective) -> None:
                objective(batch)["loss"].backward()
                objective.zero_grad(set_to_none=True)

            step()
            with torch.no_grad():
                shard.add_(1.0)  # the master weights change, FSDP is not told
            step()
            if trainable == "talker":
                set_model_state_dict(objective, get_model_state_dict(objective))
                step()
    finally:
        dist.destroy_process_group()
    kept, trained = seen["talker"], seen["talker+text"]
    assert torch.equal(kept[1], kept[0])  # gathered once: the old copy, no gather
    assert torch.equal(kept[2], kept[0] + 1.0)  # the load resharded it: gathered afresh
    assert torch.equal(trained[1], trained[0] + 1.0)  # trained: gathered every step


@pytest.mark.slow
def test_sharded_partial_training_equals_single_process(sharded: dict[str, Any],
                                                        tiny_model_dir: Path) -> None:
    ref = _single(tiny_model_dir, "code_predictor")
    got = sharded["code_predictor"]
    assert got["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert_grads_close(got["grads"], ref["grads"][0])
    assert all(n.startswith("talker.code_predictor.") for n in got["grads"])
    assert_adamw_weights_close(got["sd"], ref["sd"], ref["grads"])
    base = read_talker_weights(tiny_model_dir)
    for name in ref["sd"]:
        # frozen parts are bit-identical to the base; the code predictor moved
        changed = not torch.equal(got["sd"][name], base[name].float())
        assert changed == name.startswith("talker.code_predictor."), name


@pytest.mark.slow
def test_plan_counts_gradient_accumulation_memory(sharded: dict[str, Any],
                                                  tiny_model_dir: Path) -> None:
    """Plan arithmetic against the bytes FSDP2 really holds during accumulation (rank 0)."""
    from engine.config.train import TrainConfig
    from engine.train.plan import make_plan

    cfg = TrainConfig().replace(parallel={"workers": 2}, data={"batch_size": 2, "grad_accum": 2})

    def plan(mode: str) -> Any:
        return make_plan(tiny_model_dir, cfg.replace(parallel={"accum_reduce": mode}),
                         device="cpu", free=[1 << 40], seq_len=100, frames=60, choices=False)

    # reduction only on the last micro-step: whole fp32 gradients of every trainable tensor
    assert plan("last").grads == sharded["accum_last_bytes"]
    # reduce-scatter every micro-step: only the local shards, nothing unsharded left
    assert plan("every").grads == sharded["accum_every_bytes"]
    assert sharded["accum_every_unsharded"] == 0
    assert sharded["accum_last_bytes"] > 1.9 * sharded["accum_every_bytes"]
    # "auto" keeps "last" when it fits and picks "every" when only that fits
    assert plan("auto").accum_reduce == "last"
    tight = plan("every").host_total  # both CPU workers and the run's other processes
    auto = make_plan(tiny_model_dir, cfg, device="cpu", free=[tight], seq_len=100, frames=60,
                     choices=False)
    assert plan("last").host_total > tight
    assert auto.accum_reduce == "every" and auto.fits


@pytest.mark.slow
def test_accumulation_keeps_parameters_gathered_and_trains_the_same(
        sharded: dict[str, Any], single: dict[str, Any], tiny_model_dir: Path) -> None:
    """keep_gathered: each FSDP unit is all-gathered once per optimizer step (not twice
    per micro-step), the gradients and weights are those of one whole-batch step in one
    process, bit-identical to re-gathering, and the plan counts exactly what is held."""
    from engine.config.train import TrainConfig
    from engine.train.plan import count_units, make_plan

    kept, regathered = sharded["accum_keep_True"], sharded["accum_keep_False"]
    objective = build_objective(tiny_model_dir, ModelConfig(), device="meta")
    layers = len(objective.talker.model.layers) + len(
        objective.talker.code_predictor.model.layers)
    units = layers + 1  # and the root; the frozen text embedding's unit apart:
    # gathered once, at the first forward, for the whole run (keep_frozen_gathered)
    assert kept["gathers"] == STEPS * units + 1
    # re-gathering, every micro-step: each layer in forward and again in backward, the
    # root in forward only (before, the frozen text embedding too, in forward and again
    # in backward's prefetch of the unit that ran before layer 0: 2 more each micro-step)
    assert regathered["gathers"] == STEPS * ACCUM * (2 * layers + 1) + 1
    # accumulated halves of the same batch: the one-step gradient of one process
    assert kept["losses"] == pytest.approx(single["losses"], rel=1e-5)
    for got, ref in zip(kept["grads"], single["grads"], strict=True):
        assert_grads_close(got, ref)
    assert_adamw_weights_close(kept["sd"], single["sd"], single["grads"])
    # the same kernels on the same numbers: keeping changes nothing but the gathers
    assert kept["losses"] == regathered["losses"]
    assert all(torch.equal(kept["sd"][k], v) for k, v in regathered["sd"].items())
    # what stays gathered between micro-steps is the plan's term, byte for byte
    cfg = TrainConfig().replace(parallel={"workers": 2, "keep_gathered": "on"},
                                data={"batch_size": 2, "grad_accum": ACCUM})
    plan = make_plan(tiny_model_dir, cfg, device="cpu", free=[1 << 40], seq_len=100,
                     frames=60, choices=False)
    biggest = max(u.numel for u in count_units(tiny_model_dir, cfg.model, 2)
                  if u.name != "root")
    # re-gathering holds the frozen text embedding alone between micro-steps
    embedding = objective.talker.model.text_embedding.weight.numel() * 4
    assert plan.keep_gathered and kept["held"] > embedding and regathered["held"] == embedding
    assert plan.gather_buffer - 4 * biggest == kept["held"] == kept["peak"]
    # re-gathering: the most ever gathered in backward (root, current and prefetched
    # unit) is within the plan's all-gather term, which is far below keeping
    again = make_plan(tiny_model_dir, cfg.replace(parallel={"keep_gathered": "off"}),
                      device="cpu", free=[1 << 40], seq_len=100, frames=60, choices=False)
    assert not again.keep_gathered
    assert 0 < regathered["peak"] <= again.gather_buffer < plan.gather_buffer
