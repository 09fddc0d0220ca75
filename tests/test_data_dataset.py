"""Dataset: split, deterministic bucketed epochs, rank shares, resumable positions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.config.train import DataConfig
from engine.core.errors import TrainingError
from engine.data.codes import extract_codes
from engine.data.dataset import (
    VoiceData,
    epoch_batches,
    rank_share,
    split_ids,
)
from engine.train.objective import batch_to_device, build_objective, load_base_weights
from tests.helpers.voices import copy_voice


@pytest.fixture(scope="module")
def voice(prepared_voice: Path, tiny_model_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Path:
    v = copy_voice(prepared_voice, tmp_path_factory.mktemp("dataset") / "joe")
    extract_codes(v, tiny_model_dir)
    return v


def _lengths(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(40, 400, n).tolist()


def test_split_is_deterministic_disjoint_and_bounded() -> None:
    ids = [f"c{i:03d}" for i in range(50)]
    train, val = split_ids(ids, 0.1, 2, seed=1)
    assert split_ids(ids, 0.1, 2, seed=1) == (train, val)
    assert len(val) == 5 and not set(train) & set(val) and set(train) | set(val) == set(ids)
    assert split_ids(ids, 0.1, 2, seed=2)[1] != val
    assert split_ids(ids[:6], 0.05, 2, seed=1)[1].__len__() == 1  # at most a fifth
    assert split_ids(ids, 0.0, 2, seed=1)[1] == []


def test_epoch_plan_deterministic_complete_and_reshuffled() -> None:
    lengths = _lengths(103)
    a = epoch_batches(lengths, 8, 2, 4, seed=0, epoch=3)
    assert a == epoch_batches(lengths, 8, 2, 4, seed=0, epoch=3)
    assert a != epoch_batches(lengths, 8, 2, 4, seed=0, epoch=4)
    assert len(a) == (103 // 16) * 2 and all(len(b) == 8 for b in a)
    flat = [i for b in a for i in b]
    assert len(set(flat)) == len(flat)  # no clip twice in an epoch


def test_bucketing_cuts_padding() -> None:
    lengths = _lengths(512, seed=5)

    def efficiency(bucket: int) -> float:
        batches = epoch_batches(lengths, 8, 1, bucket, seed=0, epoch=0)
        real = sum(lengths[i] for b in batches for i in b)
        return real / sum(len(b) * max(lengths[i] for i in b) for b in batches)

    assert efficiency(1) < 0.7  # random batches waste a third or more
    assert efficiency(16) > 0.9


def test_rank_shares_partition_and_balance() -> None:
    lengths = _lengths(64, seed=2)
    batch = list(range(0, 64, 7))  # 10 clips
    shares = [rank_share(lengths, batch, r, 3) for r in range(3)]
    assert sorted(i for s in shares for i in s) == sorted(batch)
    assert all(shares)
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(lengths[i] for i in batch)
    with pytest.raises(ValueError):
        rank_share(lengths, batch[:2], 0, 3)


def test_voice_data_batches(voice: Path, tiny_model_dir: Path) -> None:
    cfg = DataConfig(batch_size=2, grad_accum=2, val_fraction=0.1, val_min=1)
    data = VoiceData.open(voice, tiny_model_dir, cfg)
    assert len(data.val) >= 1
    assert data.steps_per_epoch() == len(data.train) // 4
    data.check(world=2)
    with pytest.raises(TrainingError):
        data.check(world=3)

    val_ids = {c.id for c in data.val}
    epoch = data.rank_batches(1, rank=0, world=2)
    other = data.rank_batches(1, rank=1, world=2)
    assert len(epoch) == len(other) == data.micro_batches_per_epoch()
    seen = []
    for k in range(len(epoch)):
        b0, b1 = epoch[k], other[k]
        assert not set(b0["clip_ids"]) & set(b1["clip_ids"])
        seen += b0["clip_ids"] + b1["clip_ids"]
        assert b0["x_vector"].shape == (len(b0["clip_ids"]), data.x_vector.shape[0])
        # normalisers: the step's total target tokens over world x accum
        step = k // 2
        step_clips = [c for j in (2 * step, 2 * step + 1)
                      for c in epoch[j]["clip_ids"] + other[j]["clip_ids"]]
        frames = sum(data.index.clips[c]["frames"] for c in step_clips)
        assert b0["talker_norm"] == pytest.approx((frames + len(step_clips)) / 4)
        assert b0["subtalker_norm"] == pytest.approx(frames * 15 / 4)
    assert not set(seen) & val_ids
    # resumable: a fresh object indexed at k gives what iterating gave
    again = VoiceData.open(voice, tiny_model_dir, cfg).rank_batches(1, rank=0, world=2)
    k = len(epoch) - 1
    for key, value in epoch[k].items():
        assert np.array_equal(np.asarray(again[k][key]), np.asarray(value)), key
    assert data.padding_efficiency(world=2) > 0.5


def test_batches_run_through_the_objective(voice: Path, tiny_model_dir: Path) -> None:
    data = VoiceData.open(voice, tiny_model_dir, DataConfig(batch_size=3))
    objective = build_objective(tiny_model_dir, device="meta")
    load_base_weights(objective, tiny_model_dir)
    batch = data.rank_batches(0)[0]
    with torch.no_grad():
        out = objective(batch_to_device(batch, "cpu"))
    frames = sum(data.index.clips[c]["frames"] for c in batch["clip_ids"])
    assert out["talker_tokens"] == frames + 3
    assert out["subtalker_tokens"] == frames * 15
    # a random model: cross-entropy near log(vocab) for both parts
    assert 5.0 < float(out["talker"]) < 10.0 and 5.0 < float(out["subtalker"]) < 10.0
    # padding is inert: the batch's sums are the sums of each clip alone
    by_id = {c.id: c for c in data.train}
    with torch.no_grad():
        alone = [objective(batch_to_device(data.collate([by_id[c]]), "cpu"))
                 for c in batch["clip_ids"]]
    for key in ("talker_sum", "subtalker_sum"):
        assert float(sum(a[key] for a in alone)) == pytest.approx(float(out[key]), rel=1e-5)


def test_val_batches_cover_val_clips(voice: Path, tiny_model_dir: Path) -> None:
    data = VoiceData.open(voice, tiny_model_dir,
                          DataConfig(batch_size=2, val_fraction=0.2, val_min=2))
    got = [c for r in range(2) for b in data.val_batches(rank=r, world=2) for c in b["clip_ids"]]
    assert sorted(got) == sorted(c.id for c in data.val)
    assert len(data.val_batches(0, 2)) == len(data.val_batches(1, 2))
    info: dict[str, Any] = data.summary()
    assert info["train_clips"] == len(data.train) and info["reference_clip"]
