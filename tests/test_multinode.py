"""A real two-node Ray cluster on this machine, whose second node cannot see the
driver's voice folder or the engine's source.

The test runs this file as a script inside `unshare --net --mount`: a private
network namespace whose only interface is loopback (Ray then keeps every
address on 127.0.0.1, and nothing it starts can reach beyond this sandbox)
and a private mount namespace. In there:
- the head node: `ray start --head --num-cpus 1`;
- the second node: `ray start --address ... --num-cpus 1`, started in a
  further mount namespace where empty folders are bind-mounted over the
  voice folder and over the `engine/` source (the installed packages stay
  visible), so a driver path or code that is not shipped fails the run;
- a 2-worker FSDP run (gloo) of the tiny model with `--storage` in a folder
  both nodes see; one CPU per node puts the two workers on different nodes,
  checked through the mount namespace of each worker process;
- the second node's raylet killed with SIGKILL after the first checkpoint
  (never `ray stop`, which would end every Ray process on the machine), then
  started again: the run resumes from the shared storage and finishes with
  the same final loss as an uninterrupted run on the same cluster;
- every process this started killed by pid; the test checks none is left.

Before the run, a local single-machine cluster is started and closed in the
same driver process: it must not stop the later join of the real cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.sandbox import (
    ROOT,
    can_unshare,
    end_cluster,
    head_node,
    kill_tree,
    loopback_up,
    node_view,
    run_sandboxed,
    second_node,
)

# below pytest's own timeout (600 s), so the test ends its processes itself
INNER_TIMEOUT_S = 540


@pytest.mark.slow
@pytest.mark.own_cluster
def test_two_nodes_second_sees_no_voice_or_source(prepared_voice: Path, tiny_model_dir: Path,
                                                  tmp_path: Path) -> None:
    if not can_unshare():
        pytest.skip("needs root and unshare (private network and mount namespaces)")
    from tests.helpers.voices import copy_voice

    voice = copy_voice(prepared_voice, tmp_path / "driver only" / "voice")
    shared = tmp_path / "shared"
    model = shared / "models" / "tiny"  # the base model in a folder both nodes mount
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "result.json"
    t0 = time.time()
    rc, stdout, stderr = run_sandboxed(__file__, [voice, model, shared, tmp_path, out],
                                       INNER_TIMEOUT_S, "the two-node run")
    wall = time.time() - t0
    assert rc == 0 and out.is_file(), (stdout[-4000:], stderr[-6000:])
    res = json.loads(out.read_text())
    assert res["left_running"] == [], res["left_running"]
    assert res["local_then_join"], "a local cluster earlier in the process blocked the join"
    # the second node really could not see the voice or the source
    assert res["node2_view"] == {"voice": [], "engine": []}, res["node2_view"]
    assert res["nodes"] == 2 and res["preflight_ok"], res.get("preflight")
    # every node read the driver's token in the shared storage and wrote its own
    assert [n["storage"] for n in res["preflight"]["nodes"]] == ["read and write ok"] * 2
    # the voice finds the run in the shared folder through its runs/<run> symlink
    assert res["run_link"] == {"symlink": True,
                               "target": str((shared / "voice" / "killed").resolve())}
    # the two workers ran on different nodes, one of them in node 2's mount namespace
    for run in ("plain", "killed"):
        assert len(set(res[run]["worker_mnt"].values())) == 2, res[run]
        # and the engine says so too: the per-rank node labels the app shows
        assert len(set(res[run]["worker_node"].values())) == 2, res[run]
        assert res["node2_mnt"] in res[run]["worker_mnt"].values(), res[run]
    assert res["plain"]["restarts"] == 0
    assert res["killed"]["restarts"] >= 1 and res["killed"]["raylet_killed"]
    assert res["killed"]["steps"] == res["plain"]["steps"]
    # resumed from the shared storage to the same end as the uninterrupted run
    assert res["killed"]["final_loss"] == pytest.approx(res["plain"]["final_loss"], rel=1e-6)
    assert res["killed"]["checkpoint"].startswith(str(shared))
    print(f"\ntwo-node cluster test: wall {wall:.1f} s (clusters {res['cluster_s']:.1f} s, "
          f"uninterrupted run {res['plain']['wall_s']:.1f} s, run with node 2 killed and "
          f"restarted {res['killed']['wall_s']:.1f} s, final loss "
          f"{res['killed']['final_loss']:.6f} both)")


# -- the script that runs inside the namespaces -------------------------------------------------


def _mnt(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


def _main(voice: Path, model: Path, shared: Path, tmp: Path, out: Path) -> None:
    import psutil

    loopback_up()
    port = 6390
    # Ray's session sockets live under its temp folder and a UNIX socket path may not
    # exceed 107 bytes: pytest's tmp_path is too deep for that
    temp = Path(tempfile.mkdtemp(prefix="vx-ray-", dir="/tmp"))
    empty_voice, empty_src = tmp / "empty-voice", tmp / "empty-src"
    empty_voice.mkdir(exist_ok=True)
    empty_src.mkdir(exist_ok=True)
    common = ["--num-cpus", "1", "--num-gpus", "0", "--node-ip-address", "127.0.0.1",
              "--disable-usage-stats", "--block"]
    res: dict[str, Any] = {}
    procs: list[subprocess.Popen[bytes]] = []

    from engine.cluster import connect

    # a local cluster first, in this process, closed again (must not block the join below)
    t0 = time.time()
    local = connect(None, num_cpus=1)
    local.close()

    def node2() -> subprocess.Popen[bytes]:
        return second_node(port, {voice: empty_voice, ROOT / "engine": empty_src},
                           tmp / "node2-view.txt", tmp / "node2.log", common)

    try:
        procs.append(head_node(port, temp, tmp / "head.log", common))
        time.sleep(5)
        procs.append(node2())
        import ray

        from engine.train.driver import train

        deadline = time.time() + 180
        cluster = None
        while time.time() < deadline:
            try:
                cluster = connect(f"127.0.0.1:{port}")
                if ray.cluster_resources().get("CPU", 0) >= 2:
                    break
                cluster.close()
                cluster = None
            except Exception:
                pass
            time.sleep(2)
        assert cluster is not None, "the two-node cluster did not come up"
        res["local_then_join"] = True
        res["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        cluster.close()
        res["cluster_s"] = time.time() - t0
        view = node_view(tmp / "node2-view.txt")
        res["node2_view"] = {"voice": view[str(voice)], "engine": view[str(ROOT / "engine")]}
        raylet2 = next(p for p in psutil.Process(procs[1].pid).children(recursive=True)
                       if p.name() == "raylet")
        res["node2_mnt"] = _mnt(raylet2.pid)

        def run(name: str, kill: bool) -> dict[str, Any]:
            pids: dict[int, int] = {}
            mnts: dict[str, str] = {}
            nodes: dict[str, str] = {}
            state = {"killed": False}

            def on_event(ev: Any) -> None:
                d = ev.data
                if ev.kind == "state" and d.get("state") == "worker_started":
                    pids[int(d["rank"])] = int(d["pid"])
                    try:
                        mnts.setdefault(str(d["rank"]), _mnt(int(d["pid"])))
                    except OSError:
                        pass
                if ev.kind == "state" and d.get("state") == "worker_node":
                    nodes.setdefault(str(d["rank"]), str(d["node_id"]))
                if ev.kind == "state" and d.get("state") == "preflight_done":
                    res["preflight"] = d["report"]
                    res["preflight_ok"] = d["report"]["ok"]
                if (kill and not state["killed"] and ev.kind == "state"
                        and d.get("state") == "checkpoint" and d.get("step") == 2):
                    # lose node 2: its raylet dies hard (and with it its workers)
                    r2 = [p for p in psutil.Process(procs[1].pid).children(recursive=True)
                          if p.name() == "raylet"]
                    for p in r2:
                        os.kill(p.pid, signal.SIGKILL)
                    state["killed"] = True
                    time.sleep(3)
                    kill_tree([procs[1]])
                    procs[1] = node2()  # and comes back

            t = time.time()
            r = train(voice, str(model), workers=2, steps=5, checkpoint_every=1, val_every=0,
                      lr=2e-3, use_gpu=False, address=f"127.0.0.1:{port}", storage=str(shared),
                      run=name, max_failures=3, on_event=on_event)
            return {"steps": r["steps"], "final_loss": r["final_loss"],
                    "restarts": r["restarts"], "checkpoint": r["checkpoint"],
                    "worker_mnt": mnts, "worker_node": nodes,
                    "raylet_killed": state["killed"],
                    "wall_s": time.time() - t}

        res["plain"] = run("plain", kill=False)
        res["killed"] = run("killed", kill=True)
        link = voice / "runs" / "killed"
        res["run_link"] = {"symlink": link.is_symlink(), "target": str(link.resolve())}
    finally:
        end_cluster(procs, res, tmp, temp, out)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(*(Path(a) for a in sys.argv[1:6]))
