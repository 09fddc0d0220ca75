"""The GPUs a local run may use, without starting CUDA in this process.

- `CUDA_VISIBLE_DEVICES` is honoured as CUDA reads it: a comma-separated list
  of indices or UUIDs (``GPU-...``, any unique prefix); an empty value means no
  GPU; the list ends at the first entry that names no device (or repeats
  one), so ``0,7,1`` on a 4-GPU machine is just GPU 0.
- Memory and compute capability come from NVML (`nvidia-ml-py`, imported as
  `pynvml`), which reads the driver without creating a CUDA context; without
  it, from `nvidia-smi`. Neither present: no GPU.
- Indices are NVML's (PCI bus order). CUDA numbers devices fastest-first
  unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`; the two agree on machines whose GPUs
  are all the same model, which is what multi-GPU training needs anyway.
- MIG instances (``MIG-...``) are not split out: an entry naming one ends
  the list, as if it named nothing.
- On an existing Ray cluster (`--address`) none of this applies: the cluster's
  GPU resources decide (`engine.train.driver`).

The window reads `nvidia-smi` with this module's query and parser, so it imports
nothing but the standard library (tests/test_boundary.py keeps torch out of the window).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    total: int
    free: int
    capability: tuple[int, int] | None = None


def filter_visible(devices: list[GpuInfo], spec: str | None) -> list[GpuInfo]:
    """The devices `CUDA_VISIBLE_DEVICES=spec` leaves visible, in its order."""
    if spec is None:
        return list(devices)
    out: list[GpuInfo] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            break
        dev: GpuInfo | None = None
        if item.lstrip("+-").isdigit():
            idx = int(item)
            dev = next((d for d in devices if d.index == idx), None) if idx >= 0 else None
        elif item.startswith("GPU-"):
            found = [d for d in devices if d.uuid.startswith(item)]
            dev = found[0] if len(found) == 1 else None
        if dev is None or dev in out:
            break
        out.append(dev)
    return out


def _nvml_devices() -> list[GpuInfo] | None:
    """Every GPU the driver knows, via NVML; None when NVML is not available."""
    try:
        import pynvml  # noqa: PLC0415
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver (NVMLError_LibraryNotFound, DriverNotLoaded)
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            name = pynvml.nvmlDeviceGetName(h)
            try:
                cap: tuple[int, int] | None = tuple(  # type: ignore[assignment]
                    pynvml.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                cap = None
            out.append(GpuInfo(i, uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                               name.decode() if isinstance(name, bytes) else str(name),
                               int(mem.total), int(mem.free), cap))
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


#: the `nvidia-smi --query-gpu` fields `parse_smi` reads, in order; compute_cap last
#: because old drivers do not know it (the rows parse without it)
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "memory.free", "compute_cap")


def smi_query(capability: bool = True) -> list[str]:
    """The `nvidia-smi` arguments whose output `parse_smi` reads."""
    fields = SMI_FIELDS if capability else SMI_FIELDS[:-1]
    return [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def parse_smi(text: str) -> list[GpuInfo]:
    """Rows of `nvidia-smi` run with `smi_query()` (memory in MiB, read into bytes);
    rows that do not parse are skipped."""
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            continue
        try:
            cap = None
            if len(cols) > 5 and "." in cols[5]:
                major, minor = cols[5].split(".", 1)
                cap = (int(major), int(minor))
            out.append(GpuInfo(int(cols[0]), cols[1], cols[2], int(float(cols[3])) << 20,
                               int(float(cols[4])) << 20, cap))
        except ValueError:
            continue
    return out


def _smi_devices() -> list[GpuInfo]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    for capability in (True, False):  # old drivers do not know compute_cap
        try:
            text = subprocess.run([exe, *smi_query(capability)], capture_output=True,
                                  text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return parse_smi(text)
    return []


def all_gpus() -> list[GpuInfo]:
    found = _nvml_devices()
    return found if found is not None else _smi_devices()


def visible_gpus(env: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs this process (and the workers it starts) may use."""
    env = os.environ if env is None else env
    return filter_visible(all_gpus(), env.get("CUDA_VISIBLE_DEVICES"))


def min_capability(gpus: list[GpuInfo]) -> tuple[int, int] | None:
    """The oldest compute capability among `gpus` (what a run's precision must suit)."""
    caps = [g.capability for g in gpus if g.capability is not None]
    return min(caps) if caps else None
