"""The Train page's settings column: base model, hardware, run settings, cluster, buttons.

It only holds the form: what the values mean is the engine's business. Each run setting
is a field of the engine's config made into a widget (`gui.settings_form`): its range,
label, help and flag come from the config's schema, so `train_args` writes the command
line `voxshard-engine train` parses, by the same rules. The presets are the engine's
(`engine.train.presets`): while one is chosen the form shows its values and sends only
its name, so the engine's preset decides the run as it does for `train` with no flags;
"Custom" sends the form's values. `load_run_config` fills the form back from a run's
saved config.json, so a run picked from the list can be continued or repeated as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
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
    QVBoxLayout,
    QWidget,
)

from engine import catalog
from engine.config.evaluate import EvaluateConfig
from engine.config.schema import field_help, lookup, path_of
from engine.config.train import LENGTH_SECTIONS, ModelConfig, ParallelConfig
from engine.train.presets import (
    VOLUMES,
    band_preset,
    base_optim_preset,
    base_talker_hidden,
    preset_band_of,
    volume_index,
)
from gui.pages.train.gpus import Gpu
from gui.pages.train.provenance import field_source, not_asked, sources_words
from gui.settings_form import SettingField
from gui.widgets import SciSpinBox, button, hbox

BASE_MODELS = ["Qwen/Qwen3-TTS-12Hz-1.7B-Base", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"]

# the words a user reads for engine/config/train.py's choices: {value: (text, tooltip)}
PRECISIONS = {"auto": ("Automatic", "bf16 on GPUs that support it (compute capability 8.0+), "
                       "fp16 with loss scaling on older GPUs, fp32 on CPU"),
              "bf16": ("bf16", "bf16 compute with fp32 master weights and reductions"),
              "fp16": ("fp16", "fp16 compute with loss scaling (GPUs without bf16)"),
              "fp32": ("fp32", "full precision: slowest, most memory")}
TRAINABLES = {"talker": ("Talker + code predictor", "The recommended full fine-tune"),
              "talker+text": ("Talker + predictor + text", "Also the text embedding "
                              "(311M parameters more)"),
              "code_predictor": ("Code predictor only", "Acoustic detail, not prosody"),
              "talker_layers": ("Talker layers only", "The talker's decoder layers, not its "
                                "embeddings or the code predictor"),
              "lora": ("LoRA adapters", "Small adapters on the talker's attention and MLP: "
                       "fits 1.7B on one 16-24 GB GPU; export merges them")}
#: the run settings the form shows, in its order (fields of engine/config/train.py)
FORM_SETTINGS = ("run.steps", "run.epochs", "optim.lr", "run.checkpoint_every",
                 "model.trainable",
                 "model.lora_rank", "model.lora_alpha", "model.lora_predictor",
                 "parallel.precision", "parallel.activation_checkpointing",
                 "parallel.cpu_offload", "model.predictor_frames")
#: the words of a setting left to the engine: no step count, the epochs decide
UNSET = {"run.steps": "by epochs"}
#: settings that only mean something with LoRA adapters
LORA_SETTINGS = ("lora_rank", "lora_alpha", "lora_predictor")


@dataclass(frozen=True)
class Preset:
    """One of the engine's bands of audio (`engine.train.presets.VOLUMES`) and the run
    its preset trains (`band_preset`); the learning rate is the engine's for the base
    model, the batch size the engine's for the voice's clips."""

    name: str
    #: its name on the command line (`train --preset`)
    key: str
    max_minutes: float
    note: str
    epochs: float
    checkpoint_every: int


# the run's length and cadence do not depend on the model's size
PRESETS = [Preset(v.name, v.key, v.below_minutes, v.note, band_preset(i, 0)["run"]["epochs"],
                  band_preset(i, 0)["run"]["checkpoint_every"])
           for i, v in enumerate(VOLUMES)]


def preset_for(minutes: float | None) -> Preset:
    return PRESETS[volume_index(minutes)]


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
        #: the labels of the form's run settings by field name (a switch has none)
        self.labels: dict[str, QLabel] = {}
        #: where the values shown came from (`show_provenance`); {}: the form's own
        self._provenance: dict[str, str] = {}
        col = QWidget()
        lay = QVBoxLayout(col)
        lay.setContentsMargins(0, 0, 8, 0)
        self.boxes = [self._model_box(), self._hardware_box(), self._settings_box(),
                      self._cluster_box()]
        for box in self.boxes:
            lay.addWidget(box)
        lay.addStretch(1)

        self._build_buttons()
        self.scroll = QScrollArea()
        self.scroll.setWidget(col)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # the scroll bar's room is kept: showing or hiding it never reflows the form
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOn)
        controls = self._build_controls()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.scroll, 1)
        outer.addWidget(controls)
        self.apply_preset(0)
        for w in (self.steps, self.epochs, self.lr, self.ckpt_every):
            w.valueChanged.connect(self._edited)
        # the preset's learning rate is the engine's for the base model chosen
        self.base.currentTextChanged.connect(lambda _t: self.apply_preset(
            self.preset.currentIndex()))
        self._forget_provenance_on_edit()
        self.setMinimumWidth(370)

    def _build_buttons(self) -> None:
        """The run's buttons (wired by the page) and the note above them."""
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


    def _build_controls(self) -> QWidget:
        """The run controls under the form: its note and buttons, two a row."""
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
        return controls

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
        self.base.setToolTip(field_help(ModelConfig)["base"])
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
        self.workers_field = SettingField(ParallelConfig, "workers")
        self.workers = self.workers_field.widget
        self.workers.setValue(2)  # on CPU, two workers show the run sharded
        lay.addWidget(self.gpu_list)
        lay.addWidget(self.gpu_note)
        lay.addWidget(hbox(QLabel(self.workers_field.label), self.workers, stretch_at=2))
        return box

    def _settings_box(self) -> QGroupBox:
        box = QGroupBox("Settings")
        form = QFormLayout(box)
        self._build_preset()
        self._build_fields()
        form.addRow("Preset", self.preset)
        form.addRow(self.preset_note)
        for field in self.fields.values():
            if isinstance(field.widget, QCheckBox):
                form.addRow(field.widget)
            else:
                # a long name (Code predictor frames) wraps rather than widen the form
                label = QLabel(field.label)
                label.setWordWrap(True)
                label.setToolTip(field.widget.toolTip())
                self.labels[field.name] = label
                form.addRow(label, field.widget)
        # where the values of the last dry run or loaded run came from, when not the form
        self.provenance_note = QLabel()
        self.provenance_note.setObjectName("Muted")
        self.provenance_note.setWordWrap(True)
        self.provenance_note.hide()
        form.addRow(self.provenance_note)
        self._trainable_changed()
        self._build_evaluation()
        form.addRow(self.evaluate)
        form.addRow(self.patience_field.label, self.patience)
        form.addRow(self.style_weight_field.label, self.style_weight)
        return box

    def _build_preset(self) -> None:
        """The preset choice (the engine's bands of audio, then Custom) and its note."""
        self.preset = QComboBox()
        for p in PRESETS:
            self.preset.addItem(p.name)
        self.preset.addItem(CUSTOM)
        # as narrow as the form's other choices (gui/settings_form.py): its longest name
        # made the form wider than its column, and the column cut every box's right side
        self.preset.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.preset.setMinimumContentsLength(14)
        self.preset.setToolTip("The engine's run length, checkpoints, batch size and "
                               "learning rate for the amount of audio the voice has; "
                               "\"Custom\" once you change them")
        self.preset.currentIndexChanged.connect(self.apply_preset)
        self.preset_note = QLabel()
        self.preset_note.setObjectName("Muted")
        self.preset_note.setWordWrap(True)

    def _build_fields(self) -> None:
        """The form's run settings, each made from its config field."""
        lr = SciSpinBox()  # its arrows halve or double it
        lr.setRange(1e-8, 1e-2)
        words = {"trainable": TRAINABLES, "precision": PRECISIONS}
        #: the form's run settings by field name, each made from its config field
        self.fields = {lookup(path)[1]: SettingField(
            *lookup(path), words=words.get(lookup(path)[1]), unset=UNSET.get(path, ""),
            widget=lr if path == "optim.lr" else None) for path in FORM_SETTINGS}
        f = self.fields
        self.steps, self.epochs, self.lr, self.ckpt_every = (
            f[n].widget for n in ("steps", "epochs", "lr", "checkpoint_every"))
        self.steps.setSingleStep(100)
        self.trainable, self.precision = f["trainable"].widget, f["precision"].widget
        self.act_ckpt, self.offload = f["activation_checkpointing"].widget, \
            f["cpu_offload"].widget
        self.predictor_frames = f["predictor_frames"].widget
        self.predictor_frames.setSingleStep(0.125)
        self.lora_rank, self.lora_alpha, self.lora_predictor = (
            f[n].widget for n in LORA_SETTINGS)
        self.trainable.currentIndexChanged.connect(self._trainable_changed)

    def _build_evaluation(self) -> None:
        """Evaluation beside training: its switch, early stop and the best pick's style
        weight."""
        self.evaluate = QCheckBox("Evaluate each checkpoint")
        self.evaluate.setToolTip("Beside training, render held-out sentences from each new "
                                 "checkpoint and measure similarity to the speaker and word "
                                 "errors (a second engine process; on a GPU it needs memory)")
        self.patience_field = SettingField(EvaluateConfig, "patience")
        self.patience = self.patience_field.widget
        self.patience.setSpecialValueText("never")  # its 0
        # the best-checkpoint rule's weight of style obedience: the watcher's own setting
        self.style_weight_field = SettingField(EvaluateConfig, "style_weight", decimals=2)
        self.style_weight = self.style_weight_field.widget
        self.style_weight.setSingleStep(0.1)
        self.style_weight.setEnabled(False)
        self.evaluate.toggled.connect(self.style_weight.setEnabled)

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

    def preset_lr(self) -> float:
        """The engine's learning rate for the base model chosen."""
        return float(base_optim_preset(self.base.currentText())["lr"])

    def chosen_preset(self) -> Preset | None:
        """The preset chosen, or None: "Custom"."""
        index = self.preset.currentIndex()
        return PRESETS[index] if 0 <= index < len(PRESETS) else None

    def apply_preset(self, index: int) -> None:
        """Show the preset's values (what the engine will train with; the batch size is
        not the form's: the engine fits it to the voice's clips)."""
        if not 0 <= index < len(PRESETS):
            return  # "Custom": the values stay as they are
        p = PRESETS[index]
        self._applying = True
        try:
            self.fields["steps"].set_value(None)
            self.epochs.setValue(p.epochs)
            self.lr.setValue(self.preset_lr())
            self.ckpt_every.setValue(p.checkpoint_every)
        finally:
            self._applying = False
        self.preset_note.setText(p.note)

    # -- provenance ----------------------------------------------------------------
    def _provenance_fields(self) -> dict[str, tuple[QWidget, str, QLabel | None]]:
        """{setting path: (its widget, its help, its label)} of the fields a value's source
        is shown on."""
        shown: dict[str, tuple[QWidget, str, QLabel | None]] = {
            path_of(f.cls, name): (f.widget, field_help(f.cls).get(name, ""),
                                   self.labels.get(name))
            for name, f in self.fields.items()}
        shown["model.base"] = (self.base, field_help(ModelConfig)["base"], None)
        shown["parallel.workers"] = (self.workers, field_help(ParallelConfig)["workers"], None)
        return shown

    def show_provenance(self, provenance: Mapping[str, str]) -> None:
        """Where the engine's values came from (a dry run's, a run's saved config's
        "provenance"): each field the form did not set says whose value it shows in its
        tooltip, and the note under the settings names the sources other than the
        defaults ("Learning rate from the preset for 0.6B"). {}: the form's own again."""
        shown = self._provenance_fields()
        sources = not_asked(provenance, shown)
        for path, (widget, help_text, label) in shown.items():
            tip = field_source(help_text, sources.get(path))
            widget.setToolTip(tip)
            if label is not None:
                label.setToolTip(tip)
        words = sources_words(sources)
        self.provenance_note.setText(words)
        self.provenance_note.setVisible(bool(words))
        self._provenance = dict(provenance)

    def _forget_provenance_on_edit(self) -> None:
        """A field changed by hand is the form's own: the sources shown no longer hold."""
        def edited(*_args: Any) -> None:
            if self._provenance and not self._applying:
                self.show_provenance({})
        for widget, _help, _label in self._provenance_fields().values():
            name = next(n for n in ("valueChanged", "currentTextChanged", "toggled")
                        if hasattr(widget, n))
            getattr(widget, name).connect(edited)

    def _trainable_changed(self) -> None:
        """LoRA's own settings are offered with LoRA, at the engine's defaults."""
        lora = self.trainable.currentData() == "lora"
        for name in LORA_SETTINGS:
            self.fields[name].widget.setEnabled(lora)
            if not lora:
                self.fields[name].set_value(self.fields[name].default)

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

    def setting_args(self, length: bool) -> list[str]:
        """The flags of the form's run settings: those that shape the run (`length` False,
        what `plan` takes) or set its length and rate (True: none while a preset is
        chosen, whose name `common_args` sends; "Custom" sends them all, steps or else
        epochs); LoRA's only with LoRA."""
        if length and self.chosen_preset() is not None:
            return []
        lora = self.trainable.currentData() == "lora"
        # one length or the other, as the CLI takes them
        skip = {"epochs" if self.fields["steps"].value() is not None else "steps"}
        if not lora:
            skip.update(LORA_SETTINGS)
        args: list[str] = []
        for name, field in self.fields.items():
            if (field.cls.__section__ in LENGTH_SECTIONS) != length:  # type: ignore[attr-defined]
                continue
            if name not in skip:
                args += field.args(always=length)
        return args

    def common_args(self, voice: str, base: bool = True) -> list[str]:
        args = [voice, *(("--base", self.base.currentText().strip()) if base else ()),
                "--workers", str(self.workers.value())]
        if self.remote_radio.isChecked() and self.address.text().strip():
            args += ["--address", self.address.text().strip()]
        chosen = self.chosen_preset()
        if chosen is not None:  # the engine's preset of that band (a resume keeps its own)
            args += ["--preset", chosen.key]
        return args + self.setting_args(length=False)

    def preflight_args(self, voice: str) -> list[str] | None:
        address = self.address.text().strip()
        if not self.remote_radio.isChecked() or not address:
            return None
        args = ["preflight", voice, "--base", self.base.currentText().strip(),
                "--address", address]
        if self.storage.text().strip():
            args += ["--storage", self.storage.text().strip()]
        return args

    def evaluate_args(self, voice: str, run: str, training_pid: int) -> list[str] | None:
        """`evaluate --watch` beside the run, when asked for: it ends itself once training's
        process has ended and each checkpoint is measured or noted (the engine's rule)."""
        if not self.evaluate.isChecked():
            return None
        args = ["evaluate", voice, "--run", run, "--watch", "--interval", "10",
                "--training-pid", str(training_pid),
                *self.style_weight_field.args(always=True)]
        return args + self.patience_field.args()

    def train_args(self, voice: str, resume: bool = False, run: str | None = None
                   ) -> list[str]:
        """`train` with the form's settings; a resume sends no base model: the run trains on
        its own (`engine.train.resolve.resume_base`), whatever the form shows."""
        args = ["train", *self.common_args(voice, base=not resume),
                *self.setting_args(length=True)]
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
        # the engine's rule: the preset whose values the run trained with, else its own
        i = preset_band_of(config, base_talker_hidden(self.base.currentText()))
        self.preset.blockSignals(True)
        self.preset.setCurrentIndex(i if i is not None else self.preset.findText(CUSTOM))
        self.preset.blockSignals(False)
        self.preset_note.setText(PRESETS[i].note if i is not None else "the run's own settings")

    def _load_run_config(self, table: Any) -> None:
        model, run, par = table("model"), table("run"), table("parallel")
        if isinstance(model.get("base"), str) and model["base"]:
            self.base.setEditText(model["base"])
        if isinstance(par.get("workers"), int) and self.workers.isEnabled():
            self.workers.setValue(par["workers"])
        for field in self.fields.values():
            # a value the run did not save (an older run) leaves the field as it is; a
            # saved None is the engine's choice (steps: by epochs)
            section = table(field.cls.__section__)  # type: ignore[attr-defined]
            if field.name in section:
                field.set_value(section[field.name])
        # evaluation is the window's choice, not the run's: left as it is
        if isinstance(par.get("address"), str) and par["address"]:
            self.remote_radio.setChecked(True)
            self.address.setText(par["address"])
            storage = run.get("storage") or table("").get("storage")
            if isinstance(storage, str):
                self.storage.setText(storage)
        else:
            self.local_radio.setChecked(True)
