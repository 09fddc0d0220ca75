"""The Train page's settings column: base model, hardware, run settings, cluster, buttons.

It only holds the form: what the values mean is the engine's business
(`voxshard-engine train --help`); `train_args` turns the form into that command
line, and `load_run_config` fills it back from a run's saved config.json, so a
run picked from the list can be continued or repeated as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine import catalog
from gui.pages.train.gpus import Gpu
from gui.widgets import SciSpinBox, button, hbox

BASE_MODELS = ["Qwen/Qwen3-TTS-12Hz-1.7B-Base", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"]

# engine/config/train.py's choices, with the words a user reads
# (value, short text, tooltip)
PRECISIONS = [("auto", "Automatic", "bf16 on GPUs that support it (compute capability 8.0+), "
               "fp16 with loss scaling on older GPUs, fp32 on CPU"),
              ("bf16", "bf16", "bf16 compute with fp32 master weights and reductions"),
              ("fp16", "fp16", "fp16 compute with loss scaling (GPUs without bf16)"),
              ("fp32", "fp32", "full precision: slowest, most memory")]
TRAINABLES = [("talker", "Talker + code predictor", "The recommended full fine-tune"),
              ("talker+text", "Talker + predictor + text", "Also the text embedding "
               "(311M parameters more)"),
              ("code_predictor", "Code predictor only", "Acoustic detail, not prosody"),
              ("talker_layers", "Talker layers only", "The talker's decoder layers, not its "
               "embeddings or the code predictor"),
              ("lora", "LoRA adapters", "Small adapters on the talker's attention and MLP: "
               "fits 1.7B on one 16-24 GB GPU; export merges them")]


@dataclass(frozen=True)
class Preset:
    name: str
    max_minutes: float
    steps: int
    lr: float
    note: str


PRESETS = [
    Preset("Few minutes of audio", 5, 400, 2e-6,
           "short run, low learning rate to avoid overfitting"),
    Preset("Standard (5–30 min)", 30, 1500, 2e-6, "the usual fine-tune"),
    Preset("Large (over 30 min)", 1e9, 4000, 2e-6, "more steps for more data"),
]


def preset_for(minutes: float | None) -> Preset:
    for p in PRESETS:
        if minutes is None or minutes < p.max_minutes:
            return p
    return PRESETS[-1]


def _combo(items: list[tuple[str, str, str]]) -> QComboBox:
    box = QComboBox()
    for i, (value, text, tip) in enumerate(items):
        box.addItem(text, value)
        box.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
    box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    box.setMinimumContentsLength(14)
    return box


def _select(box: QComboBox, value: object) -> None:
    i = box.findData(value)
    if i >= 0:
        box.setCurrentIndex(i)


CUSTOM = "Custom"


class TrainSettings(QWidget):
    """The form (scrolls) above the run controls (always visible). Buttons are created
    here and wired by the page."""

    #: a base model that cannot be trained from, in one sentence with what to do
    base_rejected = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.gpus: list[Gpu] = []
        self._applying = False
        col = QWidget()
        lay = QVBoxLayout(col)
        lay.setContentsMargins(0, 0, 8, 0)
        self.boxes = [self._model_box(), self._hardware_box(), self._settings_box(),
                      self._cluster_box()]
        for box in self.boxes:
            lay.addWidget(box)
        lay.addStretch(1)

        self.plan_btn = button("Check memory plan", "info",
                               tip="Ask the engine how much memory each GPU needs with these "
                                   "settings, before starting")
        self.start_btn = button("Start training", "play", primary=True,
                                tip="Start a new run with the settings above")
        self.resume_btn = button("Resume", "resume",
                                 tip="Continue the run chosen on the right from its last "
                                     "checkpoint, with its own saved settings")
        self.stop_btn = button("Stop", "stop", danger=True,
                               tip="Saves a checkpoint, then stops; press again to force")
        self.stop_btn.setEnabled(False)
        # "Force stop" is the longer text: the button keeps that width, so pressing Stop
        # never reflows the row
        self.stop_btn.setText("Force stop")
        self.stop_btn.setMinimumWidth(self.stop_btn.sizeHint().width())
        self.stop_btn.setText("Stop")
        self.export_btn = button("Export model", "save",
                                 tip="Write the chosen run's best checkpoint (else its "
                                     "latest) as a model folder the official loader and "
                                     "Listen can use")
        self.evaluate_btn = button("Evaluate now", "check",
                                   tip="Render held-out sentences from every checkpoint of "
                                       "the chosen run and measure similarity to the speaker "
                                       "and word errors")
        self.report_btn = button("Open report", "info",
                                 tip="Open the chosen run's evaluation report (report.html)")
        self.run_note = QLabel("")
        self.run_note.setObjectName("Muted")
        self.run_note.setWordWrap(True)

        self.scroll = QScrollArea()
        self.scroll.setWidget(col)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # the scroll bar's room is kept: showing or hiding it never reflows the form
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        controls = QWidget()
        clay = QVBoxLayout(controls)
        clay.setContentsMargins(0, 6, 8, 0)
        clay.addWidget(self.run_note)
        grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        for i, b in enumerate((self.start_btn, self.resume_btn, self.stop_btn, self.export_btn,
                               self.evaluate_btn, self.report_btn, self.plan_btn)):
            grid.addWidget(b, i // 2, i % 2)
        clay.addLayout(grid)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.scroll, 1)
        outer.addWidget(controls)
        self.apply_preset(0)
        for w in (self.steps, self.lr, self.ckpt_every):
            w.valueChanged.connect(self._edited)
        self.setMinimumWidth(370)

    def set_running(self, running: bool) -> None:
        """Lock the form while a run is live: its settings were fixed at the start, and
        an edit would do nothing."""
        for box in self.boxes:
            box.setEnabled(not running)
            box.setToolTip("Locked while the run trains: its settings were fixed when it "
                           "started." if running else "")

    def _edited(self) -> None:
        if not self._applying:
            i = self.preset.findText(CUSTOM)
            self.preset.blockSignals(True)
            self.preset.setCurrentIndex(i)
            self.preset.blockSignals(False)
            self.preset_note.setText("your own settings")

    # -- boxes ---------------------------------------------------------------------
    def _model_box(self) -> QGroupBox:
        box = QGroupBox("Base model")
        lay = QVBoxLayout(box)
        self.base = QComboBox()
        self.base.setEditable(True)
        self.base.addItems(BASE_MODELS)
        self.base.setToolTip("A Hugging Face hub id or a local model folder.")
        self.base.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.base.setMinimumContentsLength(20)
        lay.addWidget(self.base)
        self.download_btn = button("Download", "import",
                                   tip="Fetch the hub model into the local cache "
                                       "(resumes an interrupted download)")
        lay.addWidget(hbox(button("Local folder…", "folder", slot=self._browse_base),
                           self.download_btn))
        self.download_bar = QProgressBar()
        self.download_bar.hide()
        self.model_note = QLabel("")
        self.model_note.setObjectName("Muted")
        self.model_note.setWordWrap(True)
        lay.addWidget(self.download_bar)
        lay.addWidget(self.model_note)
        return box

    def _hardware_box(self) -> QGroupBox:
        box = QGroupBox("Hardware")
        lay = QVBoxLayout(box)
        self.gpu_list = QListWidget()
        self.gpu_list.setMaximumHeight(120)
        self.gpu_list.itemChanged.connect(lambda _i: self._gpu_selection_changed())
        self.gpu_note = QLabel("Looking for GPUs…")
        self.gpu_note.setObjectName("Muted")
        self.gpu_note.setWordWrap(True)
        self.workers = QSpinBox()
        self.workers.setRange(1, 64)
        self.workers.setValue(2)
        self.workers.setToolTip("Training processes: one per GPU (on CPU, each takes cores)")
        lay.addWidget(self.gpu_list)
        lay.addWidget(self.gpu_note)
        lay.addWidget(hbox(QLabel("Workers"), self.workers, stretch_at=2))
        return box

    def _settings_box(self) -> QGroupBox:
        box = QGroupBox("Settings")
        form = QFormLayout(box)
        self.preset = QComboBox()
        for p in PRESETS:
            self.preset.addItem(p.name)
        self.preset.addItem(CUSTOM)
        self.preset.setToolTip("Steps and learning rate for the amount of audio the voice "
                               "has; \"Custom\" once you change them")
        self.preset.currentIndexChanged.connect(self.apply_preset)
        self.preset_note = QLabel()
        self.preset_note.setObjectName("Muted")
        self.preset_note.setWordWrap(True)
        self.steps = QSpinBox()
        self.steps.setRange(1, 10_000_000)
        self.steps.setSingleStep(100)
        self.steps.setToolTip("Optimizer steps in the whole run (each step sees one batch "
                              "per worker)")
        self.lr = SciSpinBox()
        self.lr.setRange(1e-8, 1e-2)
        self.lr.setToolTip("Learning rate: how far each step moves the weights. Fine-tuning "
                           "a voice wants a small one (2.0e-06); too large forgets how to "
                           "speak. The arrows halve or double it.")
        self.ckpt_every = QSpinBox()
        self.ckpt_every.setRange(1, 1_000_000)
        self.ckpt_every.setToolTip("A checkpoint every N steps; Stop also saves one")
        self.trainable = _combo(TRAINABLES)
        self.trainable.setToolTip("Which parts of the model learn; LoRA trains small "
                                  "adapters and merges them on export")
        self.precision = _combo(PRECISIONS)
        self.precision.setToolTip("Number format of the computation: Automatic picks the "
                                  "best the hardware supports")
        self.act_ckpt = QCheckBox("Activation checkpointing")
        self.act_ckpt.setToolTip("Recompute activations in backward: less memory, ~30% slower")
        self.offload = QCheckBox("Offload to CPU memory")
        self.offload.setToolTip("Keep parameters, gradients and optimizer state in CPU "
                                "memory between uses: fits larger models, slower")
        self.predictor_frames = QDoubleSpinBox()
        self.predictor_frames.setRange(0.01, 1.0)
        self.predictor_frames.setDecimals(3)
        self.predictor_frames.setSingleStep(0.125)
        self.predictor_frames.setValue(1.0)
        self.predictor_frames.setToolTip(
            "Share of each step's audio frames the code predictor (the fine detail of the "
            "sound) learns from. 1 uses every frame. Lower is faster, since the predictor is "
            "most of a step, but each frame's detail is learnt from less often; the main "
            "codebook and validation always use every frame.")
        form.addRow("Preset", self.preset)
        form.addRow(self.preset_note)
        form.addRow("Steps", self.steps)
        form.addRow("Learning rate", self.lr)
        form.addRow("Checkpoint every", self.ckpt_every)
        form.addRow("What trains", self.trainable)
        form.addRow("Precision", self.precision)
        form.addRow(self.act_ckpt)
        form.addRow(self.offload)
        form.addRow("Code predictor frames", self.predictor_frames)
        self.evaluate = QCheckBox("Evaluate each checkpoint")
        self.evaluate.setToolTip("Beside training, render held-out sentences from each new "
                                 "checkpoint and measure similarity to the speaker and word "
                                 "errors (a second engine process; on a GPU it needs memory)")
        self.patience = QSpinBox()
        self.patience.setRange(0, 100)
        self.patience.setSpecialValueText("never")
        self.patience.setToolTip("Stop training (saving a checkpoint) when the best checkpoint "
                                 "has not improved for this many evaluations")
        form.addRow(self.evaluate)
        form.addRow("Early stop after", self.patience)
        return box

    def _cluster_box(self) -> QGroupBox:
        box = QGroupBox("Cluster")
        lay = QVBoxLayout(box)
        self.local_radio = QRadioButton("Local (this machine, loopback only)")
        self.remote_radio = QRadioButton("Existing Ray cluster")
        self.local_radio.setChecked(True)
        group = QButtonGroup(box)
        group.addButton(self.local_radio)
        group.addButton(self.remote_radio)
        self.address = QLineEdit()
        self.address.setPlaceholderText("ray://host:10001 or host:6379")
        self.storage = QLineEdit()
        self.storage.setPlaceholderText("storage every node reaches: /shared/runs or s3://…")
        self.storage.setToolTip("Where the run's checkpoints live. On one machine the voice's "
                                "own runs/ folder; on a cluster a folder every node mounts, "
                                "or an s3:// or gs:// location.")
        self.preflight_btn = button("Check cluster", "check",
                                    tip="Ask every node whether it can reach the storage and "
                                        "the model, with matching versions")
        self.preflight_list = QListWidget()
        self.preflight_list.setMaximumHeight(110)
        self.preflight_list.hide()
        for w in (self.address, self.storage, self.preflight_btn):
            w.setEnabled(False)
            self.remote_radio.toggled.connect(w.setEnabled)
        lay.addWidget(self.local_radio)
        lay.addWidget(self.remote_radio)
        lay.addWidget(self.address)
        lay.addWidget(self.storage)
        lay.addWidget(self.preflight_btn)
        lay.addWidget(self.preflight_list)
        return box

    def show_preflight(self, report: dict[str, Any]) -> None:
        """The engine's per-node preflight report (state `preflight_done`)."""
        self.preflight_list.clear()
        for node in report.get("nodes") or []:
            facts = node.get("facts") or {}
            ok = bool(node.get("ok"))
            head = (f"{'✓' if ok else '✗'} {node.get('hostname')} ({node.get('address')})"
                    f"{' — driver' if node.get('driver_node') else ''}: Python "
                    f"{facts.get('python')}, torch {facts.get('torch')}, Ray {facts.get('ray')}")
            item = QListWidgetItem(head)
            problems = [str(p) for p in node.get("problems") or []]
            if problems:
                item.setText(head + "\n    " + "\n    ".join(problems))
                item.setForeground(Qt.GlobalColor.red)
            item.setToolTip("\n".join(problems + [str(n) for n in node.get("notes") or []]))
            self.preflight_list.addItem(item)
        self.preflight_list.setVisible(self.preflight_list.count() > 0)

    # -- behaviour -----------------------------------------------------------------
    def _browse_base(self) -> None:
        dlg = QFileDialog(self, "Choose a Qwen3-TTS model folder")
        dlg.setFileMode(QFileDialog.FileMode.Directory)
        dlg.fileSelected.connect(self.pick_base)
        self.base_dialog = dlg
        dlg.open()

    def pick_base(self, folder: str) -> bool:
        """A folder chosen as the base model, checked at once: one that training would
        refuse is not taken (the form keeps the model it had) and the note says why."""
        if not self.check_base(folder):
            return False
        self.base.setEditText(folder)
        return True

    def check_base(self, base: str | None = None) -> bool:
        """Whether training can start from `base` (default: the form's); if not, the model
        note says why and what to do, in the engine's words."""
        problem = catalog.base_model_problem(self.base.currentText() if base is None
                                             else base)
        if problem is None:
            if self.model_note.objectName() == "Warn":  # the last refusal no longer holds
                self._note_base("", "Muted")
            return True
        text = " ".join(problem).strip()
        self._note_base(text, "Warn")
        self.base_rejected.emit(text)
        return False

    def _note_base(self, text: str, style: str) -> None:
        self.model_note.setObjectName(style)
        self.model_note.style().polish(self.model_note)
        self.model_note.setText(text)

    def apply_preset(self, index: int) -> None:
        if not 0 <= index < len(PRESETS):
            return  # "Custom": the values stay as they are
        p = PRESETS[index]
        self._applying = True
        try:
            self.steps.setValue(p.steps)
            self.lr.setValue(p.lr)
            self.ckpt_every.setValue(max(1, p.steps // 4))
        finally:
            self._applying = False
        self.preset_note.setText(p.note)

    def show_gpus(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.gpu_list.blockSignals(True)
        self.gpu_list.clear()
        for g in gpus:
            text = (f"GPU {g.index}: {g.name} — {g.free_mib / 1024:.1f} of "
                    f"{g.total_mib / 1024:.1f} GiB free")
            if g.processes:
                text += f"\n    in use by {g.holders()}"
            item = QListWidgetItem(text)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked)
            item.setToolTip(f"Also holding memory: {g.holders()}" if g.processes
                            else "No other process holds memory on this GPU.")
            self.gpu_list.addItem(item)
        self.gpu_list.blockSignals(False)
        self.gpu_list.setVisible(bool(gpus))
        if gpus:
            busy = [g for g in gpus if g.processes]
            note = "One training worker per checked GPU."
            if busy:
                note += (" Other processes hold memory on GPU "
                         + ", ".join(str(g.index) for g in busy)
                         + ": the memory plan counts only what is free.")
            self.gpu_note.setText(note)
            self.workers.setValue(len(gpus))
            self.workers.setEnabled(False)
        else:
            self.gpu_note.setText("No NVIDIA GPU found: training runs on CPU workers "
                                  "(slow; fine for the tiny test model).")
            self.workers.setEnabled(True)

    def _gpu_selection_changed(self) -> None:
        self.workers.setValue(max(1, len(self.selected_gpus())))

    def selected_gpus(self) -> list[int]:
        return [self.gpus[i].index for i in range(self.gpu_list.count())
                if self.gpu_list.item(i).checkState() == Qt.CheckState.Checked]

    def gpu_for_rank(self, rank: int) -> Gpu | None:
        """Rank r runs on the r-th selected GPU (Ray's CUDA_VISIBLE_DEVICES order)."""
        selected = self.selected_gpus()
        if not 0 <= rank < len(selected):
            return None
        return next((g for g in self.gpus if g.index == selected[rank]), None)

    def common_args(self, voice: str) -> list[str]:
        args = [voice, "--base", self.base.currentText().strip(),
                "--workers", str(self.workers.value())]
        if self.remote_radio.isChecked() and self.address.text().strip():
            args += ["--address", self.address.text().strip()]
        trainable = self.trainable.currentData()
        if trainable != "talker":
            args += ["--trainable", str(trainable)]
        precision = self.precision.currentData()
        if precision != "auto":
            args += ["--precision", str(precision)]
        if self.act_ckpt.isChecked():
            args.append("--activation-checkpointing")
        if self.offload.isChecked():
            args.append("--cpu-offload")
        if self.predictor_frames.value() < 1.0:
            args += ["--predictor-frames", f"{self.predictor_frames.value():g}"]
        return args

    def preflight_args(self, voice: str) -> list[str] | None:
        address = self.address.text().strip()
        if not self.remote_radio.isChecked() or not address:
            return None
        args = ["preflight", voice, "--base", self.base.currentText().strip(),
                "--address", address]
        if self.storage.text().strip():
            args += ["--storage", self.storage.text().strip()]
        return args

    def evaluate_args(self, voice: str, run: str) -> list[str] | None:
        """`evaluate --watch` beside the run, when asked for."""
        if not self.evaluate.isChecked():
            return None
        args = ["evaluate", voice, "--run", run, "--watch", "--interval", "10"]
        if self.patience.value():
            args += ["--patience", str(self.patience.value())]
        return args

    def train_args(self, voice: str, resume: bool = False, run: str | None = None
                   ) -> list[str]:
        args = ["train", *self.common_args(voice), "--steps", str(self.steps.value()),
                "--lr", f"{self.lr.value():.6g}",
                "--checkpoint-every", str(self.ckpt_every.value())]
        if "--address" in args and self.storage.text().strip():
            args += ["--storage", self.storage.text().strip()]  # `plan` takes no storage
        if resume:
            args.append("--resume")
            if run:
                args += ["--run", run]  # the run on screen, never a guess
        return args

    def load_run_config(self, config: dict[str, Any]) -> None:
        """Fill the form from a run's config.json (engine/config/train.py's tree)."""
        def table(name: str) -> dict[str, Any]:
            value = config.get(name) if name else config
            return value if isinstance(value, dict) else {}

        self._applying = True
        try:
            self._load_run_config(table)
        finally:
            self._applying = False
        i = next((i for i, p in enumerate(PRESETS) if p.steps == self.steps.value()
                  and abs(p.lr - self.lr.value()) < 1e-12
                  and self.ckpt_every.value() == max(1, p.steps // 4)), None)
        self.preset.blockSignals(True)
        self.preset.setCurrentIndex(i if i is not None else self.preset.findText(CUSTOM))
        self.preset.blockSignals(False)
        self.preset_note.setText(PRESETS[i].note if i is not None else "the run's own settings")

    def _load_run_config(self, table: Any) -> None:
        model, optim, run, par = table("model"), table("optim"), table("run"), table("parallel")
        if isinstance(model.get("base"), str) and model["base"]:
            self.base.setEditText(model["base"])
        if isinstance(run.get("steps"), int):
            self.steps.setValue(run["steps"])
        if isinstance(run.get("checkpoint_every"), int):
            self.ckpt_every.setValue(run["checkpoint_every"])
        if isinstance(optim.get("lr"), int | float):
            self.lr.setValue(float(optim["lr"]))
        if isinstance(par.get("workers"), int) and self.workers.isEnabled():
            self.workers.setValue(par["workers"])
        _select(self.trainable, model.get("trainable"))
        if isinstance(model.get("predictor_frames"), int | float):
            self.predictor_frames.setValue(float(model["predictor_frames"]))
        _select(self.precision, par.get("precision"))
        self.act_ckpt.setChecked(bool(par.get("activation_checkpointing")))
        # evaluation is the window's choice, not the run's: left as it is
        self.offload.setChecked(bool(par.get("cpu_offload")))
        if isinstance(par.get("address"), str) and par["address"]:
            self.remote_radio.setChecked(True)
            self.address.setText(par["address"])
            storage = run.get("storage") or table("").get("storage")
            if isinstance(storage, str):
                self.storage.setText(storage)
        else:
            self.local_radio.setChecked(True)
