"""What each node of a Ray cluster needs for a run, checked before the run starts.

Preflight (`run_preflight`): one Ray task pinned to every alive node checks,
from that node,
- the storage: it reads a token the driver wrote there (so a folder of the
  same name that is *not* shared is caught), writes its own file and reads it
  back; the driver then reads every node's file;
- the base model: the driver's model folder at the same path, or the model
  in that node's Hugging Face cache, or a hub id it can download;
- versions: Python, torch, CUDA, NCCL and Ray must match the driver's.
  Voxshard's own code needs no check: it travels with the job
  (`engine.cluster.code_runtime_env`).
The report names each node and what is wrong there, with what to do.

Node-side helpers the training workers use (`engine.train.launch`):
- `node_model_dir`: the base model on this node (same path, cache, or a
  download once per node, under a lock), else a `FatalTrainingError` naming
  the node;
- `pack_voice_data` / `unpack_voice_data`: the prepared codes and the
  x-vector travel through Ray's object store and are unpacked once per node
  into a content-addressed temporary folder, so no worker reads the driver's
  voice folder.

Imports neither torch nor ray at module level.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.cluster import connect
from engine.core.errors import ClusterError, ModelError
from engine.core.events import EventCallback, as_emitter
from engine.core.storage import (
    Location,
    as_location,
    expand_arg,
    rmtree,
    run_location,
    storage_arg,
)
from engine.layout.exports import is_model_folder
from engine.layout.manifest import CODES_INDEX, prepared_folder
from engine.layout.voice import open_voice
from engine.model.loading import HUB_ID, download_model, hub_offline, resolve_model
from engine.train.failures import FatalTrainingError
from engine.train.gpus import visible_gpus

#: the folder, under the storage location, where preflight files go (removed afterwards)
PREFLIGHT_DIR = ".voxshard-preflight"
#: seconds the driver waits for every node's answer
DEFAULT_TIMEOUT_S = 120.0


# -- facts about one node -------------------------------------------------------------------

def node_facts() -> dict[str, Any]:
    """Versions and identity of the node this runs on (no CUDA initialisation)."""
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": sys.platform,
        "torch": None, "cuda": None, "nccl": None, "ray": None,
    }
    try:
        import torch  # noqa: PLC0415

        facts["torch"] = torch.__version__
        facts["cuda"] = torch.version.cuda
        if torch.version.cuda and torch.cuda.is_available():
            try:
                v = torch.cuda.nccl.version()
                facts["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:  # built without NCCL
                facts["nccl"] = None
    except ImportError:
        pass
    try:
        import ray  # noqa: PLC0415

        facts["ray"] = ray.__version__
        facts["node_ip"] = ray.util.get_node_ip_address()
    except Exception:
        pass
    try:  # NVML: free memory and compute capability of each visible GPU, no CUDA context

        gpus = visible_gpus()
        facts["gpu_free"] = [int(g.free) for g in gpus]
        facts["gpu_capability"] = [list(g.capability) if g.capability else None for g in gpus]
    except Exception:
        facts["gpu_free"], facts["gpu_capability"] = [], []
    return facts


def version_problems(node: dict[str, Any], driver: dict[str, Any]) -> list[str]:
    """What differs from the driver in a way that breaks a run."""
    out = []
    labels = {"python": "Python", "torch": "torch", "ray": "Ray", "cuda": "CUDA (torch build)",
              "nccl": "NCCL"}
    for key, label in labels.items():
        mine, theirs = node.get(key), driver.get(key)
        if key == "nccl" and (mine is None or theirs is None):
            continue  # a CPU-only node or driver: NCCL is not used between them
        if key == "python":
            # pickled code and data need the same minor version
            mine = ".".join(str(mine).split(".")[:2]) if mine else mine
            theirs = ".".join(str(theirs).split(".")[:2]) if theirs else theirs
        if mine != theirs:
            out.append(f"{label} {mine or 'missing'} here, {theirs or 'missing'} on the driver")
    return out


# -- the base model on a node ---------------------------------------------------------------

def _hub_id(spec: str | None) -> str | None:
    if spec and not os.path.isabs(spec) and not spec.startswith((".", "~")) \
            and HUB_ID.match(spec):
        return spec
    return None


def find_model(model_dir: str, spec: str | None, *, download: bool,
               log: Any = None) -> tuple[Path | None, str]:
    """(folder, how) for the base model on this node; (None, why not) when it cannot.

    Order: the driver's folder at the same path (shared or copied), then the
    hub id in this node's Hugging Face cache, then (download=True) a download
    on this node, once: concurrent workers wait on a lock file.
    """
    if model_dir and is_model_folder(Path(model_dir)):
        return Path(model_dir), "same path as the driver"
    hub = _hub_id(spec)
    if hub is None:
        return None, f"the model folder {model_dir} does not exist on this node"
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415

        return Path(snapshot_download(hub, local_files_only=True)), "Hugging Face cache"
    except Exception:
        pass

    if hub_offline():
        return None, (f"{hub} is not in this node's Hugging Face cache and downloading is off "
                      "(HF_HUB_OFFLINE)")
    if not download:
        return None, f"{hub} will be downloaded on this node when the run starts"

    lock_path = Path(tempfile.gettempdir()) / f"voxshard-download-{_digest(hub.encode())}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download per node; others wait, then hit the cache
        try:
            if log is not None:
                log(f"{socket.gethostname()}: downloading {hub} (once for this node)")

            return Path(download_model(hub)), "downloaded on this node"
        except Exception as exc:
            return None, f"downloading {hub} failed: {str(exc).splitlines()[0]}"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def node_model_dir(model_dir: str, spec: str | None, log: Any = None) -> Path:
    """The base model on this node, or a FatalTrainingError that names the node."""
    found, why = find_model(model_dir, spec, download=True, log=log)
    if found is not None:
        return found

    raise FatalTrainingError(
        "model_missing",
        f"Node {socket.gethostname()} cannot get the base model: {why}.",
        "Put the model folder at the same path on every node (or in a folder they all mount), "
        "or train from a hub id so each node downloads it once.")


# -- the prepared data through the object store ----------------------------------------------

def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24]


def pack_voice_data(voice_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The files a worker reads from a voice (codes index, codes, x-vector, and the
    manifest, whose rows carry the clips' style descriptions) as bytes."""
    codes = prepared_folder(voice_dir).codes_dir
    index_bytes = (codes / CODES_INDEX).read_bytes()
    index = json.loads(index_bytes)
    names = sorted({str(c["file"]) for c in index.get("clips", {}).values()}
                   | ({str(index["x_vector_file"])} if index.get("x_vector_file") else set()))
    files = {CODES_INDEX: index_bytes}
    for name in names:
        files[name] = (codes / name).read_bytes()
    manifest = prepared_folder(voice_dir).manifest
    rows = manifest.read_bytes() if manifest.is_file() else b""
    h = hashlib.sha256(hashlib.sha256(rows).digest())
    for name in sorted(files):
        h.update(name.encode())
        h.update(hashlib.sha256(files[name]).digest())
    return {"digest": h.hexdigest()[:24], "name": Path(voice_dir).name, "files": files,
            "manifest": rows}


def unpack_voice_data(bundle: dict[str, Any], root: str | None = None) -> Path:
    """Write a `pack_voice_data` bundle once per node; returns a voice-shaped folder."""
    base = Path(root or tempfile.gettempdir()) / f"voxshard-{os.getuid()}" / "voice-data"
    dest = base / bundle["digest"]
    if prepared_folder(dest).codes_index.is_file():
        return dest
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".{bundle['digest']}.{uuid.uuid4().hex[:8]}"
    tmp_codes = prepared_folder(tmp).codes_dir
    tmp_codes.mkdir(parents=True)
    for name, data in bundle["files"].items():
        (tmp_codes / name).write_bytes(data)
    prepared_folder(tmp).manifest.write_bytes(bundle.get("manifest", b""))
    try:
        os.rename(tmp, dest)  # atomic; another worker of this node may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# -- the preflight ---------------------------------------------------------------------------

@dataclass
class NodeReport:
    node_id: str
    hostname: str
    address: str
    facts: dict[str, Any] = field(default_factory=dict)
    storage: str = ""
    model: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    driver_node: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass
class PreflightReport:
    nodes: list[NodeReport]
    storage: str
    model: str
    seconds: float

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "storage": self.storage, "model": self.model,
                "seconds": round(self.seconds, 2), "nodes": [n.to_dict() for n in self.nodes]}

    def table(self) -> str:
        lines = [f"Preflight of {len(self.nodes)} node(s); storage {self.storage}; "
                 f"model {self.model}:"]
        for n in self.nodes:
            f = n.facts
            head = (f"  {'ok ' if n.ok else 'BAD'} {n.hostname} ({n.address})"
                    f"{' [driver]' if n.driver_node else ''}: Python {f.get('python')}, "
                    f"torch {f.get('torch')}, Ray {f.get('ray')}"
                    + (f", CUDA {f.get('cuda')}" if f.get("cuda") else "")
                    + (f", NCCL {f.get('nccl')}" if f.get("nccl") else "")
                    + (f", {f.get('gpus', 0):g} GPU(s)" if f.get("gpus") else ""))
            lines.append(head)
            lines += [f"      - {p}" for p in n.problems]
            lines += [f"      . {x}" for x in n.notes]
        return "\n".join(lines)

    def gpu_free(self) -> list[int]:
        """Free bytes of every GPU of the cluster, smallest first (where a plan must fit:
        Ray may place a worker on any of them)."""
        return sorted(f for n in self.nodes for f in n.facts.get("gpu_free") or [])

    def gpu_capability(self) -> tuple[int, int] | None:
        """The oldest compute capability among the cluster's GPUs (None: none known)."""
        caps = [tuple(c) for n in self.nodes for c in n.facts.get("gpu_capability") or [] if c]
        return min(caps) if caps else None  # type: ignore[return-value]

    def problem_sentence(self) -> str:
        bad = [n for n in self.nodes if not n.ok]
        return "; ".join(f"{n.hostname} ({n.address}): {', '.join(n.problems)}" for n in bad)


def _storage_check(storage: str, token: str, node_key: str) -> tuple[list[str], str]:
    """From a node: read the driver's token, write this node's file, read it back."""
    folder = as_location(storage) / PREFLIGHT_DIR / token
    try:
        seen = (folder / "driver").read_text()
    except Exception as exc:
        return ([f"cannot read the storage {storage} ({type(exc).__name__}: "
                 f"{str(exc).splitlines()[0] if str(exc) else 'not found'}); it is not the "
                 "driver's storage seen from here (a local folder, or not mounted)"], "")
    if seen.strip() != token:
        return [f"the storage {storage} here is not the driver's (its check file differs)"], ""
    try:
        mine = folder / f"node-{node_key}"
        mine.write_text(node_key)
        if mine.read_text().strip() != node_key:
            return [f"the storage {storage} did not read back what this node wrote"], ""
    except Exception as exc:
        return [f"cannot write to the storage {storage} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"], ""
    return [], "read and write ok"


def check_node(storage: str | None, model_dir: str | None, model_spec: str | None,
               token: str, driver: dict[str, Any]) -> dict[str, Any]:
    """The body of one preflight task (runs on the node it is pinned to)."""
    facts = node_facts()
    node_key = ray.get_runtime_context().get_node_id()
    problems = version_problems(facts, driver)
    notes: list[str] = []
    storage_note = ""
    if storage:
        more, storage_note = _storage_check(storage, token, node_key)
        problems += more
    model_note = ""
    if model_dir or model_spec:
        found, how = find_model(model_dir, model_spec, download=False)
        if found is None and "will be downloaded" in how:
            notes.append(how)
            model_note = "download at start"
        elif found is None:
            problems.append(how)
        else:
            model_note = f"{found} ({how})"
    return {"node_id": node_key, "facts": facts, "problems": problems, "notes": notes,
            "storage": storage_note, "model": model_note}


def _storage_folder(storage: str | None, token: str) -> Path | Location | None:
    """This check's folder in the storage, with the driver's token written; None without
    a storage. A storage this machine cannot write to is a ClusterError."""
    if not storage:
        return None
    folder = as_location(storage) / PREFLIGHT_DIR / token
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "driver").write_text(token)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ClusterError(f"This machine cannot write to the storage {storage} "
                           f"({type(exc).__name__}{': ' + first if first else ''}).",
                           "Check the folder or bucket and its credentials (for s3:// "
                           "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL).",
                           ) from exc
    return folder


def _node_report(node: dict[str, Any], ref: Any, answered: bool, timeout_s: float,
                 driver_node: str) -> NodeReport:
    """One node's row: its task's answer, or why there is none."""
    res = node.get("Resources", {})
    rep = NodeReport(node_id=node["NodeID"], hostname=node.get("NodeManagerHostname", "?"),
                     address=node.get("NodeManagerAddress", "?"),
                     driver_node=node["NodeID"] == driver_node)
    if not answered:
        ray.cancel(ref, force=True)
        rep.problems.append(f"did not answer within {timeout_s:.0f} s (no worker could start "
                            "there: check its Python environment and logs)")
    else:
        try:
            out = ray.get(ref)
            rep.facts = out["facts"]
            rep.hostname = out["facts"].get("hostname", rep.hostname)
            rep.problems, rep.notes = out["problems"], out["notes"]
            rep.storage, rep.model = out["storage"], out["model"]
        except Exception as exc:
            rep.problems.append(f"the check failed: {str(exc).strip().splitlines()[-1]}")
    rep.facts["gpus"] = float(res.get("GPU", 0.0))
    rep.facts["cpus"] = float(res.get("CPU", 0.0))
    return rep


def _check_shared(rep: NodeReport, folder: Path | Location | None,
                  storage: str | None) -> None:
    """The driver sees what the node wrote: the same storage, both ways."""
    if folder is None or rep.problems or not rep.storage:
        return
    try:
        if (folder / f"node-{rep.node_id}").read_text().strip() != rep.node_id:
            raise ValueError("differs")
    except Exception:
        rep.problems.append(f"what this node wrote to {storage} is not visible from the "
                            "driver: the storage is not shared")


def _remove_folder(folder: Path | Location | None) -> None:
    """This check's folder gone (and the preflight folder with it when it held no other)."""
    if folder is None:
        return
    try:
        rmtree(folder.parent if len(list(folder.parent.iterdir())) <= 1 else folder)
    except Exception:
        pass


def run_preflight(storage: str | None, model_dir: str | None, model_spec: str | None = None,
                  *, timeout_s: float = DEFAULT_TIMEOUT_S,
                  on_event: EventCallback | None = None) -> PreflightReport:
    """One task per alive node of the connected cluster; every node's answer, or why none."""
    emitter = as_emitter(on_event)
    t0 = time.monotonic()
    token = uuid.uuid4().hex
    folder = _storage_folder(storage, token)
    driver = node_facts()
    driver_node = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    emitter.state("preflight", detail=f"checking {len(nodes)} node(s)")
    task = ray.remote(num_cpus=0, max_retries=0)(check_node)
    refs = {}
    for n in nodes:
        strategy = NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
        refs[n["NodeID"]] = task.options(scheduling_strategy=strategy).remote(
            storage, model_dir, model_spec, token, driver)
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    reports = []
    for n in nodes:
        ref = refs[n["NodeID"]]
        rep = _node_report(n, ref, ref in ready, timeout_s, driver_node)
        _check_shared(rep, folder, storage)
        reports.append(rep)
    _remove_folder(folder)
    report = PreflightReport(reports, storage or "(none)", model_spec or model_dir or "(none)",
                             time.monotonic() - t0)
    # the table once for a person (the CLI's result shows it too when all is well)
    emitter.log(report.table(), level="debug" if report.ok else "warning")
    # the per-node report, structured (the app shows it; `--json` consumers read it)
    emitter.state("preflight_done", detail="ok" if report.ok else "problems",
                  report=report.to_dict())
    return report


def check_cluster(voice: str | os.PathLike[str], base: str, *, address: str | None = None,
                  storage: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  on_event: EventCallback | None = None) -> dict[str, Any]:
    """`voxshard-engine preflight`: connect, check every node for this voice's next run.

    The storage checked is the folder the voice's runs would go to (`--storage`,
    else the voice's setting, else its runs/ folder); the model is the driver's
    resolved folder, or the hub id alone when this machine does not have it.
    """

    emitter = as_emitter(on_event)
    v = open_voice(voice)
    spec = expand_arg(str(base))
    try:
        model_dir: str | None = os.path.abspath(resolve_model(spec, download=False))
    except ModelError:
        if _hub_id(spec) is None:
            raise
        model_dir = None  # each node finds or downloads the hub id itself
    if storage is not None and str(storage).strip().lower() in ("default", "local"):
        target = None
    else:
        target = storage_arg(storage) if storage is not None else v.storage
    folder = run_location(target, v.runs_dir, v.path.name, "x").rstrip("/").rpartition("/")[0]
    if target is None:
        v.runs_dir.mkdir(parents=True, exist_ok=True)
    cluster = connect(address, on_event=emitter)
    try:
        report = run_preflight(folder, model_dir or "", spec, timeout_s=timeout_s,
                               on_event=emitter)
    finally:
        cluster.close()
    out = report.to_dict()
    out["problems"] = report.problem_sentence()
    out["summary"] = report.table()
    return out
