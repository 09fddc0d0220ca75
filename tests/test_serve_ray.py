"""`voxshard-engine serve --address`: the speech app as a Ray Serve deployment on a real
two-node Ray cluster on this machine, driven by the official `openai` client.

The cluster is built as tests/test_multinode.py builds it (its helpers are reused): this
file runs as a script inside `unshare --net --mount` (a private loopback-only network,
so Ray and Ray Serve's proxy stay on 127.0.0.1 and their ports collide with nothing);
the head node and a second node of one CPU each, the second in a further mount
namespace where an empty folder hides the `engine/` source (the replicas there run the
code Ray ships). In there:
- the real CLI, `voxshard-engine --json serve --address ... --replicas 2`, deploys two
  replicas of one CPU each: one per node;
- both replicas answer speech requests of the `openai` client through Ray Serve's
  proxy (each replica's /health names its node and counts what it served);
- node 2's raylet is killed with SIGKILL: requests go on being answered by the head
  node's replica (the ones that fail while Ray has not yet noticed are counted);
- node 2 comes back: a new replica starts there and answers again;
- SIGTERM ends the CLI, which removes the application; every process is killed by pid
  and none is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.sandbox import (
    can_unshare,
    end_cluster,
    head_node,
    kill_tree,
    loopback_up,
    node_view,
    run_sandboxed,
    second_node,
)

ROOT = Path(__file__).resolve().parent.parent
PORT = 6390  # the Ray port `is_ours` knows, inside this test's own network namespace
HTTP = 8000
KEY = "ray-serve-key-0123456789"
SHORT = {"max_frames": 8, "seed": 3}
# below pytest's own timeout (600 s), so the test ends its processes itself
INNER_TIMEOUT_S = 540
#: bounds of the waits inside (each a ceiling, not an expectation)
UP_S, DETECT_S, BACK_S = 300, 60, 150
#: most speech requests sent while waiting for both replicas to have served one
MAX_TRIES = 32


@pytest.mark.slow
@pytest.mark.own_cluster
def test_ray_serve_two_nodes_survive_a_lost_node(tiny_model_dir: Path,
                                                 tmp_path: Path) -> None:
    if not can_unshare():
        pytest.skip("needs root and unshare (private network and mount namespaces)")
    from tests.helpers.voices import make_workspace

    ws = make_workspace(tmp_path, tiny_model_dir)
    out = tmp_path / "result.json"
    t0 = time.time()
    rc, stdout, stderr = run_sandboxed(__file__, [ws, tmp_path, out], INNER_TIMEOUT_S,
                                       "the Ray Serve run")
    wall = time.time() - t0
    assert out.is_file(), (rc, stdout[-4000:], stderr[-6000:])
    res = json.loads(out.read_text())
    assert rc == 0 and "error" not in res, (res, stderr[-6000:])
    assert res["left_running"] == [], res["left_running"]
    assert res["node2_engine"] == [], "node 2 could see the engine source"
    assert res["serving"]["nodes"] == 2 and res["serving"]["auth"] is True
    # two replicas on two nodes, both answered speech requests of the openai client
    up = res["up"]
    assert up["wav_ok"] == up["requests"], up
    assert len(up["served_by_node"]) == 2 and all(n > 0 for n in
                                                  up["served_by_node"].values()), up
    assert up["wrong_key"] == 401
    # node 2 lost: once Ray noticed, every request was answered, by the head's replica
    lost = res["lost"]
    assert lost["detected"], lost
    assert lost["after_detection"]["ok"] == lost["after_detection"]["sent"] >= 4, lost
    assert set(lost["after_detection"]["nodes"]) == {res["head_node"]}, lost
    # node 2 back: a replica runs there again and answers
    back = res["back"]
    assert back["ok"], back
    assert len(back["nodes"]) == 2 and res["head_node"] in back["nodes"], back
    assert back["speech_on_new_node"] > 0, back
    # SIGTERM: the CLI removed its application and the Ray Serve it started, and ended
    assert res["stopped"] == {"rc": 0, "serve_left": False}, res["stopped"]
    print(f"\nRay Serve two-node test: wall {wall:.1f} s (cluster up "
          f"{res['cluster_s']:.1f} s, deploy {res['serving']['deploy_s']:.1f} s; node 2 "
          f"lost: Ray noticed after {lost['detect_s']:.1f} s, {lost['during']['failed']} of "
          f"{lost['during']['sent']} requests failed before that, "
          f"{lost['after_detection']['ok']}/{lost['after_detection']['sent']} answered after; "
          f"replica back {back['back_s']:.1f} s after the node restarted)")


# -- the script that runs inside the namespaces -------------------------------------------------


def _ray_env() -> dict[str, str]:
    # Ray notices a dead raylet by missed health checks (defaults: every 3 s, 5 misses);
    # tighter here so the test waits less, the same path all the same
    return {**os.environ, "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3", "RAY_health_check_timeout_ms": "1000"}


def _main(ws: Path, tmp: Path, out: Path) -> None:  # noqa: C901
    import io

    import httpx2 as httpx
    import openai
    import psutil
    import soundfile as sf

    loopback_up()
    os.environ.update(_ray_env())
    temp = Path(tempfile.mkdtemp(prefix="vx-rs-", dir="/tmp"))  # UNIX socket paths: short
    empty_src = tmp / "empty-src"
    empty_src.mkdir(exist_ok=True)
    common = ["--num-cpus", "1", "--num-gpus", "0", "--node-ip-address", "127.0.0.1",
              "--disable-usage-stats", "--block"]
    res: dict[str, Any] = {}
    procs: list[subprocess.Popen[Any]] = []
    key_file = tmp / "key"
    key_file.write_text(KEY)

    def node2() -> subprocess.Popen[bytes]:
        return second_node(PORT, {ROOT / "engine": empty_src}, tmp / "node2-view.txt",
                           tmp / "node2.log", common)

    def raylets(p: subprocess.Popen[Any]) -> list[Any]:
        return [c for c in psutil.Process(p.pid).children(recursive=True)
                if c.name() == "raylet"]

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{HTTP}/v1", api_key=KEY,
                           max_retries=0, timeout=60)
    http = httpx.Client(base_url=f"http://127.0.0.1:{HTTP}",
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=30)

    def speak(text: str) -> tuple[bool, str]:
        """One speech request; (answered with 24 kHz audio, the error if not)."""
        try:
            audio = client.audio.speech.create(model="tts-1", voice="ada", input=text,
                                               response_format="wav", extra_body=SHORT)
            data, rate = sf.read(io.BytesIO(audio.content))
            return rate == 24000 and len(data) > 0, ""
        except Exception as exc:  # counted: the test reports what failed and why
            return False, f"{type(exc).__name__}: {str(exc)[:160]}"

    def healths(n: int) -> dict[str, dict[str, Any]]:
        """The latest /health of each replica that answered `n` probes, by node."""
        seen: dict[str, dict[str, Any]] = {}
        for _ in range(n):
            try:
                h = http.get("/health").json()
                seen[h["node_id"]] = h
            except Exception:
                pass
        return seen

    try:
        t0 = time.time()
        procs.append(head_node(PORT, temp, tmp / "head.log", common))
        time.sleep(4)
        procs.append(node2())
        import ray

        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                ray.init(address=f"127.0.0.1:{PORT}", logging_level="ERROR",
                         log_to_driver=False)
                if ray.cluster_resources().get("CPU", 0) >= 2:
                    break
                ray.shutdown()
            except Exception:
                pass
            time.sleep(2)
        head = next(n for n in ray.nodes() if n["Alive"] and n["NodeManagerPort"] and
                    n.get("Resources", {}).get("node:__internal_head__"))
        res["head_node"] = head["NodeID"]
        res["cluster_s"] = time.time() - t0
        res["node2_engine"] = node_view(tmp / "node2-view.txt")[str(ROOT / "engine")]

        # the real CLI, as a user would run it
        cli = subprocess.Popen(
            [sys.executable, "-m", "engine.cli.main", "--json", "serve", "--address",
             f"127.0.0.1:{PORT}", "--replicas", "2", "--workspace", str(ws), "--port",
             str(HTTP), "--api-key-file", str(key_file), "--device", "cpu", "--dtype",
             "float32", "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=open(tmp / "cli.log", "w"), text=True,
            cwd=str(ROOT), start_new_session=True)
        procs.append(cli)
        events: list[dict[str, Any]] = []
        assert cli.stdout is not None

        def read() -> None:
            assert cli.stdout is not None
            for line in cli.stdout:
                events.append(json.loads(line))

        threading.Thread(target=read, daemon=True).start()
        deadline = time.time() + UP_S
        while time.time() < deadline and not any(e.get("state") == "serving" for e in events):
            if cli.poll() is not None or any(e["event"] == "error" for e in events):
                raise RuntimeError(f"the CLI did not serve: {events[-3:]}")
            time.sleep(0.5)
        serving = next(e for e in events if e.get("state") == "serving")
        res["serving"] = {k: serving.get(k) for k in ("nodes", "auth", "deploy_s", "replicas")}

        # both replicas answer: requests until each node's replica has served some
        # (the proxy picks the less busy of two replicas at random: counted, not assumed)
        from concurrent.futures import ThreadPoolExecutor

        answers: list[tuple[bool, str]] = []
        seen: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(4) as pool:
            while len(answers) < MAX_TRIES and not _both_served(seen):
                answers += pool.map(speak, [f"Hello number {i}." for i in range(8)])
                seen = healths(20)
        wrong = httpx.post(f"http://127.0.0.1:{HTTP}/v1/audio/speech",
                           headers={"Authorization": "Bearer wrong-key-0123456789"},
                           json={"model": "tts-1", "voice": "ada", "input": "hi"})
        res["up"] = {"requests": len(answers), "wav_ok": sum(ok for ok, _ in answers),
                     "errors": [e for ok, e in answers if not ok],
                     "served_by_node": {n: h["served"] for n, h in seen.items()},
                     "wrong_key": wrong.status_code, "replicas": _running()}

        # node 2's raylet dies hard; requests keep coming
        for p in raylets(procs[1]):
            os.kill(p.pid, signal.SIGKILL)
        t_kill = time.time()
        during = {"sent": 0, "failed": 0, "errors": []}
        detected = None
        while time.time() - t_kill < DETECT_S:
            ok, err = speak("Still there?")
            during["sent"] += 1
            if not ok:
                during["failed"] += 1
                during["errors"].append(err)
            if any(not n["Alive"] for n in ray.nodes()) and _running() < 2:
                detected = time.time() - t_kill
                break
        after = {"sent": 0, "ok": 0, "nodes": [], "errors": []}
        for i in range(6):
            ok, err = speak(f"After the loss {i}.")
            after["sent"] += 1
            after["ok"] += ok
            if err:
                after["errors"].append(err)
        after["nodes"] = sorted(healths(10))
        res["lost"] = {"detected": detected is not None, "detect_s": detected or -1.0,
                       "during": during, "after_detection": after}

        # node 2 comes back (what was left of it is ended first)
        kill_tree([procs[1]])
        t_back = time.time()
        procs[1] = node2()
        back: dict[str, Any] = {"ok": False, "nodes": [], "speech_on_new_node": 0}
        while time.time() - t_back < BACK_S:
            seen = healths(6)
            if len(seen) == 2:
                back.update(ok=True, back_s=time.time() - t_back)
                sent = 0
                while sent < MAX_TRIES and not _both_served(seen):
                    for i in range(4):
                        speak(f"Back again {i}.")
                    sent += 4
                    seen = healths(20)
                new = next((n for n in seen if n != res["head_node"]), "")
                back.update(nodes=sorted(seen), requests=sent,
                            speech_on_new_node=seen.get(new, {}).get("served", 0))
                break
            time.sleep(1)
        res["back"] = back

        cli.send_signal(signal.SIGTERM)
        try:
            rc = cli.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
        from engine.serve.ray_deploy import _serve_running

        # the CLI started Ray Serve, so it also shut it down (controller, proxy, replicas)
        res["stopped"] = {"rc": rc, "serve_left": _serve_running()}
    except Exception as exc:
        import traceback

        res["error"] = f"{exc}\n{traceback.format_exc()[-3000:]}"
        res["cli_log"] = (tmp / "cli.log").read_text()[-4000:] if (
            tmp / "cli.log").exists() else ""
    finally:
        import ray

        ray.shutdown()
        end_cluster(procs, res, tmp, temp, out)


def _both_served(seen: dict[str, dict[str, Any]]) -> bool:
    return len(seen) == 2 and all(h["served"] > 0 for h in seen.values())


def _running() -> int:
    """Replicas of the speech deployment that Ray Serve counts as running."""
    from engine.serve.ray_deploy import replica_states

    try:
        return replica_states().get("RUNNING", 0)
    except Exception:  # the controller is busy or moving: counted as not known
        return -1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(*(Path(a) for a in sys.argv[1:4]))
