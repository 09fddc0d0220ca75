"""Where runs live: the voice's runs/, a shared folder, or an S3 bucket.

The S3 tests run against a real S3-compatible server, moto's (`moto[s3]`,
threaded, on 127.0.0.1, test extra of this project), reached by botocore
(s3fs: DCP's fsspec writer, the checkpoint's small files, listing) and by
pyarrow through fsspec (Ray Train's own storage) via AWS_ENDPOINT_URL, the
same variable a user sets for MinIO or any other S3-compatible store.

The slow test, a real local Ray cluster with 2 CPU workers (gloo, FSDP): S3,
every rank writes its shards to the bucket, COMPLETE and the latest
checkpoint scan work there, `resume` continues from it and `export` reads
from it; nothing but config, metrics and the pointer is on local disk.
A shared folder is trained in by tests/test_multinode.py (two nodes, the
preflight first, the voice's runs/<run> a symlink into it).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.core.storage import (
    POINTER,
    Location,
    as_location,
    checkpoint_root,
    link_run,
    run_location,
)
from tests.helpers.voices import copy_voice

BUCKET = "voxshard-test"


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """A moto S3 server on loopback; AWS_* variables point every process at it."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir(BUCKET)
    try:
        yield f"s3://{BUCKET}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


# -- fast ---------------------------------------------------------------------------------------


def test_run_locations_and_links(tmp_path: Path) -> None:
    runs = tmp_path / "voice" / "runs"
    assert run_location(None, runs, "ada", "r1") == str(runs / "r1")
    shared = tmp_path / "shared é"
    assert run_location(str(shared), runs, "ada", "r1") == str(shared / "ada" / "r1")
    assert run_location("s3://b/p/", runs, "ada", "r1") == "s3://b/p/ada/r1"

    # a shared folder: runs/<run> is a symlink, the checkpoints' root is the real folder
    link_run(runs / "r1", str(shared / "ada" / "r1"))
    assert (runs / "r1").is_symlink() and (shared / "ada" / "r1").is_dir()
    assert checkpoint_root(runs / "r1") == (shared / "ada" / "r1").resolve()
    link_run(runs / "r1", str(shared / "ada" / "r1"))  # idempotent (resume)

    # the default: a plain folder that is its own root
    link_run(runs / "r2", str(runs / "r2"))
    assert checkpoint_root(runs / "r2") == runs / "r2"


def test_location_on_memory_filesystem() -> None:
    root = as_location("memory://vox/runs é/ada/r1")
    assert isinstance(root, Location) and root.name == "r1"
    (root / "a b").mkdir(parents=True, exist_ok=True)
    (root / "a b" / "x.txt").write_text("ü")
    assert (root / "a b" / "x.txt").read_text() == "ü"
    assert [p.name for p in root.iterdir()] == ["a b"]
    assert (root / "a b").is_dir() and not (root / "missing").exists()
    (root / "a b").rmtree()
    assert not (root / "a b" / "x.txt").exists()


def _tiny_state() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("where", ["s3", "folder"])
def test_checkpointer_round_trip(where: str, tmp_path: Path, request: pytest.FixtureRequest,
                                 ) -> None:
    """Save, torn-checkpoint handling, latest scan, load and prune: a bucket or a folder."""
    import torch

    from engine.layout.checkpoints import COMPLETE, latest_checkpoint
    from engine.train.checkpoint import Checkpointer

    if where == "s3":
        root: str = f"{request.getfixturevalue('s3_server')}/unit é/{tmp_path.name}"
    else:
        root = str(tmp_path / "runs ü" / "r")
    model, opt = _tiny_state()
    ck = Checkpointer(root, rank=0, world_size=1, keep=2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in (1, 2, 3):
        path = ck.save(step, model, opt, sched, {"epoch": 0, "position": step})
        assert str(path).startswith(root)
    # a torn save (no COMPLETE) is never the latest
    torn = as_location(root) / "checkpoint_step_0000009"
    torn.mkdir(parents=True, exist_ok=True)
    (torn / "trainer.json").write_text("{}")
    assert latest_checkpoint(root).name == "checkpoint_step_0000003"
    assert [p.name for p in ck.prune()] == ["checkpoint_step_0000001"]
    assert not (as_location(root) / "checkpoint_step_0000001" / COMPLETE).exists()

    saved = {k: v.clone() for k, v in model.state_dict().items()}
    fresh, fresh_opt = _tiny_state()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    state = ck.load(latest_checkpoint(root), fresh, fresh_opt, None)
    assert state["step"] == 3 and state["data"]["position"] == 3
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, saved[k]), k
    if where == "s3":
        # Ray hands a restored checkpoint back as a path without the scheme: it still loads
        bare = (as_location(root) / "checkpoint_step_0000002").fs_path
        assert ck.load(bare, fresh, fresh_opt, None)["step"] == 2


def test_preflight_node_checks(tmp_path: Path) -> None:
    """The per-node checks, run here as one node would (no cluster needed)."""
    from engine.train.preflight import (
        PREFLIGHT_DIR,
        _storage_check,
        find_model,
        pack_voice_data,
        unpack_voice_data,
        version_problems,
    )

    driver = {"python": "3.11.7", "torch": "2.13.0", "ray": "2.60.0", "cuda": None}
    assert version_problems({**driver, "python": "3.11.9"}, driver) == []
    bad = version_problems({**driver, "torch": "2.12.0", "ray": "2.59.0"}, driver)
    assert len(bad) == 2 and "torch 2.12.0 here, 2.13.0 on the driver" in bad[0]

    storage = tmp_path / "shared"
    token = "t0k"
    problems, _ = _storage_check(str(storage), token, "n1")
    assert problems and "not the driver's storage" in problems[0]
    (storage / PREFLIGHT_DIR / token).mkdir(parents=True)
    (storage / PREFLIGHT_DIR / token / "driver").write_text(token)
    assert _storage_check(str(storage), token, "n1") == ([], "read and write ok")

    found, why = find_model(str(tmp_path / "no model"), None, download=False)
    assert found is None and "does not exist on this node" in why

    voice = tmp_path / "v"
    codes = voice / "prepared" / "codes"
    codes.mkdir(parents=True)
    (codes / "a.npy").write_bytes(b"A")
    (codes / "x.npy").write_bytes(b"X")
    (codes / "index.json").write_text(json.dumps(
        {"clips": {"c1": {"file": "a.npy"}}, "x_vector_file": "x.npy"}))
    bundle = pack_voice_data(voice)
    out = unpack_voice_data(bundle, root=str(tmp_path / "node"))
    assert (out / "prepared" / "codes" / "x.npy").read_bytes() == b"X"
    assert unpack_voice_data(bundle, root=str(tmp_path / "node")) == out  # once per node


# -- slow: real runs ---------------------------------------------------------------------------


def _quiet(events: list[Any]) -> Any:
    def on_event(ev: Any) -> None:
        events.append(ev)
        if os.environ.get("VOXSHARD_TEST_VERBOSE") and ev.kind in ("state", "log", "error"):
            print(f"{ev.kind} {ev.data}", flush=True)

    return on_event


@pytest.mark.slow
@pytest.mark.own_cluster  # its workers must inherit the AWS_* variables set here
def test_train_resume_export_on_s3(s3_server: str, prepared_voice: Path, tiny_model_dir: Path,
                                   tmp_path: Path) -> None:
    from engine.cluster import connect

    voice = copy_voice(prepared_voice, tmp_path / "voice")
    storage = f"{s3_server}/runs é"
    events: list[Any] = []
    # one cluster for the run and its resume (started after the AWS_* variables are set, so
    # every Ray process has them); each train() finds Ray connected and leaves it running
    cluster = connect(None, num_cpus=2)
    try:
        _runs_on_s3(voice, tiny_model_dir, tmp_path, storage, events)
    finally:
        cluster.close()


def _runs_on_s3(voice: Path, tiny_model_dir: Path, tmp_path: Path, storage: str,
                events: list[Any]) -> None:
    """A run to the bucket, its resume and its export, on the cluster Ray is connected to."""
    import fsspec

    from engine.train.driver import train
    from engine.train.export import export

    t0 = time.time()
    r1 = train(voice, str(tiny_model_dir), workers=2, steps=2, checkpoint_every=1,
               val_every=0, use_gpu=False, storage=storage, run="s3 run",
               on_event=_quiet(events))
    t1 = time.time()
    assert r1["steps"] == 2 and r1["checkpoint"].startswith(f"{storage}/voice/s3 run/")
    saves = [e.data["save_s"] for e in events
             if e.kind == "state" and e.data.get("state") == "checkpoint"]

    # locally: config, metrics and the pointer; the checkpoints are in the bucket only
    run_dir = voice / "runs" / "s3 run"
    assert json.loads((run_dir / POINTER).read_text())["checkpoints"] == \
        f"{storage}/voice/s3 run"
    assert (run_dir / "metrics.jsonl").is_file() and not list(run_dir.glob("checkpoint_*"))
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    names = {p.rsplit("/", 1)[-1] for p in
             fs.find(f"{BUCKET}/runs é/voice/s3 run/checkpoint_step_0000002")}
    # both ranks wrote their own shard and RNG state; rank 0 the metadata and the marker
    assert {"__0_0.distcp", "__1_0.distcp", "rng_rank0.pt", "rng_rank1.pt", ".metadata",
            "trainer.json", "COMPLETE"} <= names, names
    # the voice remembers where its runs go
    from engine.layout.voice import open_voice

    assert open_voice(voice).storage == storage

    r2 = train(voice, str(tiny_model_dir), workers=2, steps=3, resume=True, run="s3 run",
               use_gpu=False, on_event=_quiet(events))
    t2 = time.time()
    assert r2["steps"] == 3 and r2["checkpoint"].endswith("checkpoint_step_0000003")
    resumed = [e for e in events if e.kind == "log" and "resumed from" in str(e.data)]
    assert resumed and "checkpoint_step_0000002" in resumed[-1].data["message"]
    assert not fs.exists(f"{BUCKET}/runs é/voice/s3 run/checkpoint_step_0000001/COMPLETE")

    out = export(voice, tmp_path / "export é", run="s3 run")
    assert out["checkpoint"] == "checkpoint_step_0000003"
    assert (tmp_path / "export é" / "config.json").is_file()
    print(f"\nS3 (moto): first run {t1 - t0:.1f} s, resume {t2 - t1:.1f} s, export "
          f"{time.time() - t2:.1f} s; checkpoint saves (tiny model, 2 ranks straight to the "
          f"bucket) {', '.join(f'{s:.2f}' for s in saves)} s")


def test_unreachable_storage_fails_before_any_cluster(prepared_voice: Path,
                                                      tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    """One sentence naming the storage; nothing started, nothing left in runs/."""
    from engine.core.errors import InputError
    from engine.train.driver import train

    voice = copy_voice(prepared_voice, tmp_path / "voice")
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    with pytest.raises(InputError, match=r"Cannot create the run's storage at .*a file"):
        train(voice, str(tiny_model_dir), workers=2, steps=1, use_gpu=False,
              storage=str(blocker / "runs"), run="r")
    assert not (voice / "runs" / "r").exists()
    from engine.layout.voice import open_voice

    assert open_voice(voice).storage is None  # a storage that failed is not remembered
