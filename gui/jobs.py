"""Background jobs: the engine runs in its own process, the window only reads events.

One `EngineJob` is one `voxshard-engine --json <command> ...` process. Its
stdout carries one JSON event per line (engine/core/events.py); the job turns them
into Qt signals on the GUI thread. QProcess delivers output through the event
loop, so nothing here ever blocks it; a burst of lines is parsed in slices so
that even a flood of metrics cannot stall the window.

Outcomes, exactly one per job, then `finished`:
- `succeeded(result)`: exit code 0 with the command's `result` event;
- `cancelled()`: the user asked to stop and the engine stopped as asked (exit
  code 130: for training, a checkpoint was saved); a cancel is not an error;
- `failed(code, message, hint)`: everything else, with the engine's one-sentence
  error, or the tail of stderr when the process died without one. A cancel
  that then failed (the engine's final save failed, or the user forced the
  stop) is a failure: nothing says "stopped" unless the engine finished its stop.

Cancel sends SIGTERM to the engine process itself, which stops cooperatively
(training asks its Ray workers to checkpoint, then shuts the cluster down).
Signalling the whole group at once would kill those workers before they
save. No timer in the window ever kills a job that is stopping: a 1.7B
checkpoint save can take minutes. Only `force_stop()`, the user's explicit
choice, kills it. The engine runs in its own session, so whatever of the group
is still alive when the engine has exited gets SIGKILL: nothing the job
started outlives it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from engine.config.schema import PLACEHOLDER
from engine.config.schema import window_words as schema_window_words

ROOT = Path(__file__).resolve().parent.parent

# At most this many lines are parsed per turn of the event loop; the rest wait
# for the next turn, so a burst of events never holds the window.
LINES_PER_SLICE = 100
EXIT_CANCELLED = 130


def engine_command() -> list[str]:
    """The command line that starts the headless engine.

    `VOXSHARD_ENGINE` overrides it (e.g. another virtual environment). A frozen
    bundle holds only the window: Ray starts its workers with a real Python
    interpreter, so the engine stays an installed Python program, found next
    to the app's executable or on PATH.
    """
    override = os.environ.get("VOXSHARD_ENGINE")
    if override:
        return shlex.split(override)
    if getattr(sys, "frozen", False):
        sibling = Path(sys.executable).with_name("voxshard-engine")
        if sibling.exists():
            return [str(sibling)]
        return [shutil.which("voxshard-engine") or "voxshard-engine"]
    return [sys.executable, "-m", "engine.cli.main"]


def settings_worded(event: dict[str, Any]) -> tuple[str, str]:
    """An error event's message and hint, each setting it names worded as the label of
    its field in the window (the engine's "{model.predictor_frames}"), not as a flag."""
    template = event.get("template")
    if not isinstance(template, str):
        return str(event.get("message") or ""), str(event.get("hint") or "")

    def say(text: Any) -> str:
        return PLACEHOLDER.sub(lambda m: schema_window_words(m.group(1)), str(text or ""))

    return say(template), say(event.get("hint_template"))


#: what Ray prints when its control process (the GCS) went away under a run
#: (phrases of Ray 2.x's own C++ and Python messages, found in its _raylet.so)
_RAY_GONE = ("GCS may have been killed", "Failed to connect to GCS",
             "GCS server is dead", "Failed to get node info from GCS",
             "the node it was running on is dead or unavailable", "raylet crashed")


def known_crash(stderr_lines: list[str]) -> tuple[str, str, str] | None:
    """One sentence and an action for engine deaths the engine could not explain itself:
    the local Ray cluster's control process stopped (another program ended every Ray
    process), which leaves only Ray's C++ log behind."""
    text = "\n".join(stderr_lines)
    if any(sign.lower() in text.lower() for sign in _RAY_GONE):
        return ("ray_gone", "The local Ray cluster's control process stopped during the run "
                "(another program may have stopped Ray).",
                "Press Resume to continue from the last checkpoint.")
    return None

class EngineJob(QObject):
    """One engine command running in a child process, reported as signals."""

    started = Signal()
    # `object`, not `dict`: PySide converts dict payloads through QVariantMap, which
    # is slow (the 6.12.0 refcount bug is handled in gui/__init__.py, for that release only)
    event = Signal(object)  # every event, raw (kind under "event")
    progress = Signal(str, float, object)  # stage, done, total (float or None)
    log = Signal(str, str)  # level, message
    metric = Signal(object)  # the event's "values" plus "rank"/"step" when given
    state = Signal(str, str)  # state, detail
    artifact = Signal(str, str)  # path, role
    succeeded = Signal(object)
    failed = Signal(str, str, str)  # code, message, hint
    cancelled = Signal()
    finished = Signal()
    #: a stop was asked for (from any place: a page, the status bar, Quit)
    stop_requested = Signal()

    def __init__(self, args: list[str], *, title: str = "", kill_after_s: float | None = None,
                 parent: QObject | None = None, env: dict[str, str] | None = None,
                 program: list[str] | None = None, voice: Path | None = None,
                 background: bool = False) -> None:
        super().__init__(parent)
        # the window's own helper (the warm speech engine), not a job the user started:
        # never listed as one
        self.background = background
        # `program` replaces the engine's command prefix (another interpreter or build)
        self.program = program
        self.args = [str(a) for a in args]
        self.title = title or (self.args[0] if self.args else "engine")
        # None: a stop is never cut short by a timer (only for jobs with nothing
        # to save, such as the speech worker, is a grace period set)
        self.kill_after_s = kill_after_s
        # the voice folder this job writes into (delete/rename wait for it)
        self.voice = Path(voice).resolve() if voice is not None else None
        self.result: dict[str, Any] | None = None
        self.error: tuple[str, str, str] | None = None
        #: the error's remedy as settings to change ({"path", "value", "why"} each)
        self.changes: list[dict[str, Any]] = []
        self.outcome: str | None = None  # "succeeded" | "failed" | "cancelled"
        self.events_seen = 0
        # counted, not timed: how many turns of the event loop parsed output,
        # and the most lines any one turn parsed (never above LINES_PER_SLICE)
        self.slices = 0
        self.max_slice_lines = 0
        self._extra_env = env or {}
        self._cancel_requested = False
        self._killed = False
        self._buffer = b""
        self._pending: deque[bytes] = deque()
        self._exit: tuple[int, QProcess.ExitStatus] | None = None
        self._pgid = 0
        self._stderr_tail: deque[str] = deque(maxlen=40)
        self._proc = QProcess(self)
        self._proc.readyReadStandardOutput.connect(self._on_stdout)
        self._proc.readyReadStandardError.connect(self._on_stderr)
        self._proc.finished.connect(self._on_finished)
        self._proc.errorOccurred.connect(self._on_process_error)
        self._proc.started.connect(lambda: setattr(self, "_pgid", self.pid() or self._pgid))
        self._drain_timer = QTimer(self)
        self._drain_timer.setSingleShot(True)
        self._drain_timer.setInterval(0)
        self._drain_timer.timeout.connect(self._drain)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.timeout.connect(self._kill)

    # -- control -----------------------------------------------------------
    def command_line(self) -> list[str]:
        cmd = [*(self.program or engine_command()), "--json", *self.args]
        # Background work yields the CPU to the window: training keeps every core
        # busy, and the window must still answer within a frame. Ray's workers
        # inherit the niceness. VOXSHARD_ENGINE_NICE=0 turns this off.
        nice = os.environ.get("VOXSHARD_ENGINE_NICE", "10")
        if sys.platform != "win32" and nice not in ("", "0") and shutil.which("nice"):
            cmd = ["nice", "-n", nice, *cmd]
        return cmd

    def start(self) -> None:
        cmd = self.command_line()
        env = QProcessEnvironment.systemEnvironment()
        # the engine must be importable from a source checkout too
        path = env.value("PYTHONPATH", "")
        env.insert("PYTHONPATH", str(ROOT) + (os.pathsep + path if path else ""))
        env.insert("PYTHONUNBUFFERED", "1")
        if not env.contains("OMP_NUM_THREADS"):
            env.insert("OMP_NUM_THREADS", "1")
        for key, value in self._extra_env.items():
            env.insert(key, value)
        self._proc.setProcessEnvironment(env)
        self._proc.setWorkingDirectory(str(ROOT))
        if sys.platform != "win32":
            # own session = own process group: cancel reaches every child
            params = QProcess.UnixProcessParameters()
            params.flags = QProcess.UnixProcessFlag.CreateNewSession
            self._proc.setUnixProcessParameters(params)
        self._proc.start(cmd[0], cmd[1:])
        # session leader: its pid is the group id, remembered for the clean-up
        self._pgid = self.pid()
        self.started.emit()

    def send(self, request: dict[str, Any]) -> None:
        """Write one JSON line to the engine's stdin (long-lived workers)."""
        self._proc.write((json.dumps(request, ensure_ascii=False) + "\n").encode("utf-8"))

    def is_running(self) -> bool:
        return self._proc.state() != QProcess.ProcessState.NotRunning

    def pid(self) -> int:
        return int(self._proc.processId())

    def cancel(self) -> None:
        """Ask the engine to stop (it saves what it must); not an error."""
        if not self.is_running() or self._cancel_requested:
            return
        self._cancel_requested = True
        self._signal_main(signal.SIGTERM)
        if self.kill_after_s is not None:
            self._kill_timer.start(int(self.kill_after_s * 1000))
        self.stop_requested.emit()

    @property
    def stopping(self) -> bool:
        """A stop was asked for and the engine is still finishing it."""
        return self._cancel_requested and self.is_running()

    def force_stop(self) -> None:
        """Kill the job now (the user's explicit choice): what it was saving is lost."""
        if not self.is_running():
            return
        self._cancel_requested = True
        self._stderr_tail.append("stopped by force before it finished stopping")
        self._killed = True
        self._signal_group(signal.SIGKILL)

    def wait(self, msecs: int = 30000) -> bool:
        """Block until the process ends (for shutdown only, never in normal use)."""
        if not self.is_running():
            return True
        done = self._proc.waitForFinished(msecs)
        return done

    def flush(self) -> None:
        """Handle every line still waiting now, and the end if it came (shutdown: no
        drain timer is left running behind a job that flooded its pipe before it ended)."""
        self._drain_timer.stop()
        while self._pending:
            self._drain()
            self._drain_timer.stop()

    def _signal_main(self, sig: int) -> None:
        pid = self.pid()
        if pid <= 0:
            return
        try:
            if sys.platform == "win32":
                self._proc.terminate()
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap_group(self) -> None:
        """SIGKILL what is left of the job's process group once the engine is gone."""
        if sys.platform == "win32" or self._pgid <= 0:
            return
        try:
            os.killpg(self._pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _signal_group(self, sig: int) -> None:
        pid = self.pid()
        if pid <= 0:
            return
        try:
            if sys.platform == "win32":
                self._proc.kill() if sig == signal.SIGKILL else self._proc.terminate()
            else:
                os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill(self) -> None:
        if self.is_running():
            self._stderr_tail.append("the engine did not stop in time; it was killed")
            self._killed = True
            self._signal_group(signal.SIGKILL)

    # -- output ------------------------------------------------------------
    def _on_stdout(self) -> None:
        data = bytes(self._proc.readAllStandardOutput().data())
        if not data:
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        self._pending.extend(lines)
        self._drain()

    def _drain(self) -> None:
        n = min(LINES_PER_SLICE, len(self._pending))
        if n:
            self.slices += 1
            self.max_slice_lines = max(self.max_slice_lines, n)
        for _ in range(n):
            self._handle_line(self._pending.popleft())
        if self._pending:
            self._drain_timer.start()
        elif self._exit is not None:
            self._conclude(*self._exit)

    def _on_stderr(self) -> None:
        text = bytes(self._proc.readAllStandardError().data()).decode("utf-8", "replace")
        for line in text.splitlines():
            if line.strip():
                self._stderr_tail.append(line.rstrip())

    def _handle_line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").strip()
        if not line:
            return
        try:
            obj = json.loads(line)
            kind = obj.get("event")
        except (ValueError, AttributeError):
            obj, kind = None, None
        if not isinstance(obj, dict) or not isinstance(kind, str):
            # a stray print from a library: keep it visible, not fatal
            self.log.emit("info", line)
            return
        self.events_seen += 1
        self.event.emit(obj)
        if kind == "progress":
            total = obj.get("total")
            self.progress.emit(str(obj.get("stage", "")), float(obj.get("done") or 0),
                               None if total is None else float(total))
        elif kind == "log":
            self.log.emit(str(obj.get("level", "info")), str(obj.get("message", "")))
        elif kind == "metric":
            values = dict(obj.get("values") or {})
            for key in ("rank", "step", "time"):
                if key in obj and key not in values:
                    values[key] = obj[key]
            self.metric.emit(values)
        elif kind == "state":
            self.state.emit(str(obj.get("state", "")), str(obj.get("detail", "") or ""))
        elif kind == "artifact":
            self.artifact.emit(str(obj.get("path", "")), str(obj.get("role", "")))
        elif "request" in obj:
            return  # a served request's own result/error (serve-speech), not the job's
        elif kind == "result":
            obj.pop("event", None)
            obj.pop("time", None)
            self.result = obj
        elif kind == "error":
            message, hint = settings_worded(obj)
            # the engine's hint in the window's words when it has them (buttons, not flags)
            hint = obj.get("window_hint") or hint
            self.error = (str(obj.get("code") or "error"), message, hint)
            self.changes = [c for c in obj.get("changes") or [] if isinstance(c, dict)]

    # -- end ---------------------------------------------------------------
    def _on_process_error(self, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart:
            self.error = ("engine_missing", "The Voxshard engine could not be started.",
                          f"Check that `{shlex.join(engine_command())}` works in a terminal.")
            self._finish("failed")

    def _on_finished(self, exit_code: int, status: QProcess.ExitStatus) -> None:
        self._kill_timer.stop()
        self._reap_group()
        # events still in the pipe come before the outcome, parsed in slices as usual
        self._on_stdout()
        if self._buffer:
            self._pending.append(self._buffer)
            self._buffer = b""
        self._exit = (exit_code, status)
        if not self._pending:
            self._conclude(exit_code, status)

    def _conclude(self, exit_code: int, status: QProcess.ExitStatus) -> None:
        normal = status == QProcess.ExitStatus.NormalExit
        cancelled_by_engine = self.error is not None and self.error[0] == "cancelled"
        if self._killed:
            # a kill can cut a save short: never reported as a clean stop
            self.error = ("killed", f"{self.title} was stopped by force before it finished "
                          "stopping; what it was saving at that moment is lost.",
                          "Everything saved before (for training, the last complete "
                          "checkpoint) is intact.")
            self._finish("failed")
        elif normal and exit_code == 0:
            self._finish("succeeded")
        elif (normal and exit_code == EXIT_CANCELLED) or cancelled_by_engine:
            self._finish("cancelled")
        elif self._cancel_requested and not normal and self.error is None:
            # a program without a SIGTERM handler ends on the signal itself:
            # it had nothing to save, so this is the stop that was asked for
            self._finish("cancelled")
        else:
            if self.error is None and exit_code in (126, 127) and not self.events_seen:
                # `nice` (or a shell) could not run the engine: it is not installed
                self.error = ("engine_missing", "The Voxshard engine could not be started.",
                              f"Check that `{shlex.join(engine_command())}` works in a "
                              "terminal.")
            if self.error is None:
                self.error = known_crash(list(self._stderr_tail))
            if self.error is None:
                tail = "\n".join(list(self._stderr_tail)[-5:])
                how = ("crashed" if status == QProcess.ExitStatus.CrashExit
                       else f"stopped with exit code {exit_code}")
                self.error = ("crashed", f"The engine {how} without saying why.",
                              tail or "Run the same command in a terminal to see more.")
            self._finish("failed")

    def _finish(self, outcome: str) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        if outcome == "succeeded":
            self.succeeded.emit(self.result or {})
        elif outcome == "cancelled":
            self.cancelled.emit()
        else:
            code, message, hint = self.error or ("error", "The job failed.", "")
            self.failed.emit(code, message, hint)
        self.finished.emit()

    def stderr_tail(self) -> list[str]:
        return list(self._stderr_tail)


class JobManager(QObject):
    """Keeps every running job alive, and knows which one a page owns."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.jobs: list[EngineJob] = []

    def start(self, args: list[str], title: str = "", **kwargs: Any) -> EngineJob:
        """Start a job; `voice=` names the voice folder it writes into."""
        job = EngineJob(args, title=title, parent=self, **kwargs)
        self.jobs.append(job)
        job.finished.connect(lambda j=job: self._forget(j))
        job.stop_requested.connect(self.changed)  # the status bar says "(stopping)"
        job.start()
        self.changed.emit()
        return job

    def _forget(self, job: EngineJob) -> None:
        # A finished job stays a child of the manager (a few KB) instead of being
        # deleteLater()'d: on every release, pages and scripts still ask a finished
        # job for its outcome and process state, which a deleted object cannot answer.
        if job in self.jobs:
            self.jobs.remove(job)
        self.changed.emit()

    def running(self) -> list[EngineJob]:
        return [j for j in self.jobs if j.is_running()]

    def writing_into(self, voice: Path | None) -> list[EngineJob]:
        """Running jobs that write into `voice` (its delete and rename must wait)."""
        if voice is None:
            return []
        target = Path(voice).resolve()
        return [j for j in self.running() if j.voice == target]

    def stop_all(self) -> None:
        """Ask every job to stop; never waits, never kills (window closing)."""
        for job in list(self.jobs):
            job.cancel()

    def shutdown(self, msecs: int = 30000) -> None:
        """Cancel every job and wait for each to end, killing after `msecs`.

        Blocks: only for tests and for a window whose jobs already ended. The
        window's own quit uses `stop_all` and waits on `changed` instead.
        """
        for job in list(self.jobs):
            job.cancel()
        for job in list(self.jobs):
            if not job.wait(msecs):
                job._signal_group(signal.SIGKILL)
                job.wait(2000)
            job.flush()
