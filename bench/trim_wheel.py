"""Make a wheel small enough to travel to the lent GPU machine: Ray's, for the device kit.

    python bench/trim_wheel.py ray-2.60.0-cp312-...whl --drop ray/jars/ --drop ray/rllib/

Ray's wheel (79 MB for CPython 3.12) is over what one device call may carry (64 MiB with
the checkout). What the proof's Ray row runs (a local cluster, Ray Train's TorchTrainer,
an actor queue) needs neither the Java worker's jar, nor the dashboard's web client,
nor RLlib, and its native programs carry their symbol tables (`strip` keeps the
dynamic symbols they link by). The trimmed wheel is written in place of the original,
with the same name, its RECORD rewritten (every file's hash and size) so pip installs
it as it would the published one.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ELF = b"\x7fELF"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _stripped(data: bytes, work: Path) -> bytes:
    """The same ELF file without its symbol tables and debug sections; unchanged when
    `strip` is missing or refuses it."""
    tool = shutil.which("strip")
    if tool is None or not data.startswith(ELF):
        return data
    src, out = work / "in", work / "out"
    src.write_bytes(data)
    done = subprocess.run([tool, "--strip-unneeded", "-o", str(out), str(src)],
                          capture_output=True)
    return out.read_bytes() if done.returncode == 0 and out.exists() else data


def trim(wheel: Path, drop: list[str]) -> tuple[int, int]:
    """Rewrite `wheel` without the paths under `drop`; (bytes before, bytes after)."""
    before = wheel.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out_path = work / wheel.name
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(
                out_path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
            record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
            lines: list[str] = []
            for info in src.infolist():
                name = info.filename
                if name == record_name or any(name.startswith(p) for p in drop):
                    continue
                data = src.read(info)
                if info.external_attr >> 16 & 0o111 or name.endswith(".so"):
                    data = _stripped(data, work)
                kept = zipfile.ZipInfo(name, date_time=info.date_time)
                kept.external_attr = info.external_attr
                kept.compress_type = zipfile.ZIP_DEFLATED
                dst.writestr(kept, data, compresslevel=9)
                lines.append(_record_line(name, data))
            lines.append(f"{record_name},,")
            dst.writestr(record_name, "\n".join(lines) + "\n")
        shutil.move(out_path, wheel)
    return before, wheel.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--drop", action="append", default=[], metavar="PREFIX",
                    help="leave out every file whose path in the wheel starts with PREFIX")
    args = ap.parse_args(argv)
    before, after = trim(args.wheel, args.drop)
    print(f"trim_wheel: {args.wheel.name} {before / 1048576:.1f} -> {after / 1048576:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
