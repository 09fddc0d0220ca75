"""The two-node sandbox of tests/test_multinode.py and tests/test_serve_ray.py.

A test runs its own file as a script inside `unshare --net --mount` (`run_sandboxed`): a
private network namespace whose only interface is loopback (`loopback_up` brings it up),
so Ray keeps every address on 127.0.0.1 and its ports collide with nothing, and a private
mount namespace. In there `head_node` starts `ray start --head`, and `second_node` starts
`ray start --address` in a further mount namespace where empty folders hide chosen paths
(`node_view` reads back what that node saw). `end_cluster` kills every process started,
by pid, and notes what of the test's cluster is left running (`is_ours`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True)
    return r.returncode == 0


def run_sandboxed(script: str, args: list[Any], timeout: float,
                  what: str) -> tuple[int, str, str]:
    """Run `script args` inside `unshare --net --mount` (a loopback-only network and a
    private mount namespace); (exit status, stdout, stderr). Fails the test on overrun."""
    # the nodes' owner decides their authentication: none, so a token another Ray left in
    # ~/.ray/ (a node that hides the home folder cannot read it) plays no part
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    # its own session: if it overruns, the whole group (both nodes included) is ended
    proc = subprocess.Popen(
        ["unshare", "--net", "--mount", "--propagation", "private", "--",
         sys.executable, script, *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT),
        start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{what} did not end within {timeout:g} s:\n"
                    f"{stdout[-3000:]}\n{stderr[-5000:]}")
    return proc.returncode, stdout, stderr


def second_node(port: int, hide: dict[Path, Path], listing: Path, log: Path,
                common: list[str]) -> subprocess.Popen[bytes]:
    """`ray start --address` in a further mount namespace where each folder of `hide`
    has an empty folder bound over it; what each then shows is listed in `listing`
    (one line per folder: its path, a tab, its entries)."""
    binds = "".join(f"mount --bind '{empty}' '{path}' && " for path, empty in hide.items())
    lists = "".join(f"printf '%s\\t%s\\n' '{path}' \"$(ls -A '{path}' | tr '\\n' ' ')\" "
                    f">> '{listing}' && " for path in hide)
    cmd = " ".join([RAY, "start", "--address", f"127.0.0.1:{port}", *common])
    return start_logged(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   f"rm -f '{listing}' && {binds}{lists}exec {cmd}"], log)


def node_view(listing: Path) -> dict[str, list[str]]:
    """What the second node saw in each hidden folder (`second_node`'s listing)."""
    view = {}
    for line in listing.read_text().splitlines():
        path, _, entries = line.partition("\t")
        view[path] = entries.split()
    return view


def loopback_up() -> None:
    """A new network namespace starts with `lo` down; bring it up (no `ip` needed)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, req)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))
    finally:
        s.close()


def start_logged(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    fh = open(log, "ab")
    return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def descendants(pid: int) -> list[int]:

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(procs: list[Any]) -> None:

    pids: set[int] = set()
    for p in procs:
        pids.add(p.pid)
        pids.update(descendants(p.pid))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except Exception:
            pass
    psutil.wait_procs([psutil.Process(x) for x in pids if psutil.pid_exists(x)], timeout=10)


def head_node(port: int, temp: Path, log: Path, common: list[str]) -> subprocess.Popen[bytes]:
    """`ray start --head` on `port`, its session files under `temp` (a short path)."""
    return start_logged([RAY, "start", "--head", "--port", str(port), "--temp-dir", str(temp),
                   "--include-dashboard", "false", *common], log)


def end_cluster(procs: list[Any], res: dict[str, Any], tmp: Path, temp: Path,
                out: Path) -> None:
    """Kill every process started (by pid), record what of ours is left running, write
    the result for the test outside the namespaces."""
    kill_tree(procs)
    me = os.getpid()

    def ours() -> list[int]:  # alive: a killed process the kernel has not reaped is not
        found = []
        for p in psutil.process_iter():
            try:
                if p.pid != me and p.status() != psutil.STATUS_ZOMBIE and is_ours(p, tmp, temp):
                    found.append(p.pid)
            except psutil.Error:
                pass  # gone while it was looked at
        return found

    # a loaded machine can take seconds to finish the kills: what is ours 10 s on is left
    deadline = time.monotonic() + 10
    left = ours()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = ours()
    res["left_running"] = left
    out.write_text(json.dumps(res, indent=1))
    shutil.rmtree(temp, ignore_errors=True)


def is_ours(p: Any, tmp: Path, temp: Path) -> bool:
    """A process of this test's cluster: its command line names our folders, or our port
    inside our own network namespace (another run of this test may use the same port
    in its namespace at the same time)."""
    try:
        cmd = " ".join(p.cmdline())
        if str(tmp) in cmd or str(temp) in cmd:
            return True
        return ("127.0.0.1:6390" in cmd
                and os.readlink(f"/proc/{p.pid}/ns/net") == os.readlink("/proc/self/ns/net"))
    except Exception:
        return False
