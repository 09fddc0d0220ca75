"""The GPUs of this machine and what holds their memory, from `nvidia-smi`, asynchronously.

The window never loads torch to ask CUDA: `nvidia-smi` answers in a separate
process, read when it exits. Two queries: the devices (the engine's own query and
parser, `engine.train.gpus`, without the compute capability old drivers lack) and
the compute processes on them (pid, name, memory), so the Train page can say what
else holds GPU memory before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QProcess, Signal

from engine.train.gpus import GpuInfo, parse_smi, smi_query

GPU_QUERY = smi_query(capability=False)
APPS_QUERY = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
              "--format=csv,noheader,nounits"]


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_mib: float


@dataclass
class Gpu:
    index: int
    name: str
    total_mib: float
    free_mib: float
    uuid: str = ""
    processes: list[GpuProcess] = field(default_factory=list)

    def holders(self) -> str:
        """What else holds memory on this GPU, in words ("" when nothing)."""
        return ", ".join(f"{p.name.rsplit('/', 1)[-1]} (pid {p.pid}, {p.used_mib / 1024:.1f} GiB)"
                         for p in self.processes)


    @classmethod
    def of(cls, info: GpuInfo) -> Gpu:
        return cls(info.index, info.name, info.total / 2**20, info.free / 2**20, info.uuid)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """The devices of a `GPU_QUERY` answer (read by the engine's parser)."""
    return [Gpu.of(info) for info in parse_smi(text)]


def attach_processes(gpus: list[Gpu], text: str) -> None:
    """Add `--query-compute-apps` rows to the GPU they run on (matched by uuid)."""
    by_uuid = {g.uuid: g for g in gpus if g.uuid}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or parts[0] not in by_uuid:
            continue
        try:
            proc = GpuProcess(int(parts[1]), parts[2], float(parts[3]))
        except ValueError:
            continue  # "[N/A]" memory on some drivers
        by_uuid[parts[0]].processes.append(proc)


class GpuProbe(QObject):
    """Runs the two queries one after the other; `found(list[Gpu])` when done."""

    found = Signal(object)

    def __init__(self, parent: QObject | None = None, program: str = "nvidia-smi") -> None:
        super().__init__(parent)
        self.program = program
        self.gpus: list[Gpu] = []
        self._proc: QProcess | None = None

    def probe(self) -> None:
        if self._proc is not None:
            return  # one probe at a time
        self._run(GPU_QUERY, self._devices_done)

    def _run(self, args: list[str], done: object) -> None:
        proc = QProcess(self)
        self._proc = proc
        proc.finished.connect(lambda code, _s: done(code, proc))  # type: ignore[operator]
        proc.errorOccurred.connect(
            lambda err: done(-1, proc)  # type: ignore[operator]
            if err == QProcess.ProcessError.FailedToStart else None)
        proc.start(self.program, args)

    def _output(self, code: int, proc: QProcess) -> str:
        text = bytes(proc.readAllStandardOutput().data()).decode() if code == 0 else ""
        proc.deleteLater()
        self._proc = None
        return text

    def _devices_done(self, code: int, proc: QProcess) -> None:
        if self._proc is not proc:
            return
        self.gpus = parse_nvidia_smi(self._output(code, proc))
        if not self.gpus:
            self.found.emit([])
            return
        self._run(APPS_QUERY, self._apps_done)

    def _apps_done(self, code: int, proc: QProcess) -> None:
        if self._proc is not proc:
            return
        attach_processes(self.gpus, self._output(code, proc))
        self.found.emit(self.gpus)
