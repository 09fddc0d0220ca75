"""The CLI's own entry point, several commands in one process: what each ended with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.helpers.serving import ROOT


def cli_ends(*commands: list[str]) -> list[dict[str, Any]]:
    """The last event (its result or its error) of each `voxshard-engine --json` command,
    all run by the CLI's own entry point in one process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # the CLI points fd 1 at stderr once it has its event stream: each command gets it back
    script = ("import json, os, sys\nfrom engine.cli.main import main\n"
              "out, fd = sys.stdout, os.dup(1)\n"
              "for argv in json.loads(sys.argv[1]):\n"
              "    os.dup2(fd, 1)\n    sys.stdout = out\n    main(argv)\n")
    argvs = [["--json", *c] for c in commands]
    out = subprocess.run([sys.executable, "-c", script, json.dumps(argvs)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    ends = [e for e in events if e["event"] in ("result", "error")]
    assert len(ends) == len(commands), out.stderr[-3000:]
    return ends
