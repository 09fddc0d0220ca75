"""Voices: the workspace folder, and create / open / rename / delete a voice."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from PySide6.QtCore import QFile, Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import VoiceEntry, VoiceSnapshot
from engine.core.errors import VoxshardError
from engine.core.kinds import TIER_PREFERENCE, Tier
from engine.layout.prompts import languages_with_prompts
from engine.layout.voice import open_voice
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.pages.base import Page
from gui.theme import icon
from gui.widgets import Card, StatCard, button, hbox, show_error

_SAFE = re.compile(r"[^\w\- .]+", re.UNICODE)



def offered_languages() -> list[str]:
    """Languages a new voice can be recorded in: those with a bundled prompt set.

    Qwen3-TTS speaks ten languages, but recording needs sentences to read; a
    language without a prompt set would leave the Record page with nothing
    to show (imported audio works in any language: the language list grows
    with the prompt sets in assets/prompts/).
    """
    try:
        found = languages_with_prompts()
    except VoxshardError:
        found = []
    return [lang.capitalize() for lang in found] or ["English"]


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


NEXT_STEPS_NEW = ("Next steps: <b>Record</b> prompted sentences or <b>Import</b> existing "
                  "audio, then <b>Prepare</b>, <b>Train</b> and <b>Listen</b>.")


def next_steps(snap: VoiceSnapshot) -> str:
    """What the voice needs next, from where it is now (not what a new voice needs)."""
    s = snap.summary
    if not s.get("takes"):
        return NEXT_STEPS_NEW
    if not s.get("prepared"):
        return ("Next steps: <b>Prepare</b> the takes, then <b>Train</b> and <b>Listen</b> "
                "(<b>Record</b> or <b>Import</b> more at any time).")
    if not snap.runs:
        return ("Next steps: <b>Train</b> the voice, or <b>Listen</b> to it as an instant "
                "voice now.")
    return ("Next steps: <b>Listen</b> to the voice; <b>Record</b> more and <b>Train</b> "
            "again to make it better.")


def tiers_text(tiers: list[dict[str, Any]]) -> str:
    """What a voice speaks with, one line per tier: its size on disk and its base model
    (the catalog's `list_tiers`: instant, adapter and full voices)."""
    if not tiers:
        return ("Speaks with: nothing yet. Prepare the voice for an instant voice, or "
                "train it.")
    lines = []
    # what the voice speaks with first (a full voice, then an adapter) leads; the instant
    # voice, what it speaks with before any training, comes last
    for t in sorted(tiers, key=lambda t: TIER_PREFERENCE.index(t["tier"])
                    if t["tier"] in TIER_PREFERENCE else len(TIER_PREFERENCE)):
        name = "" if t["tier"] == Tier.INSTANT else f" {t['name']}"
        base = f", on {Path(t['base']).name or t['base']}" if t.get("base") else ""
        if t["tier"] == Tier.INSTANT and not t.get("base"):
            # it cannot speak until a base is known: the one thing to do, in the window
            base = " (no base model yet: choose one in Listen's Base field and speak it)"
        lines.append(f"{t['tier']}{name}: {_size(int(t['size_bytes']))}{base}")
    return "Speaks with: " + "  ·  ".join(lines)


def folder_name_for(speaker: str) -> str:
    """A folder name from a speaker's name: readable, no path separators."""
    name = _SAFE.sub("", speaker).strip().strip(".")
    return re.sub(r"\s+", "-", name) or "voice"


class NewVoiceDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("New voice")
        self.setMinimumWidth(380)
        form = QFormLayout(self)
        self.speaker = QLineEdit()
        self.speaker.setPlaceholderText("e.g. Ada")
        self.language = QComboBox()
        self.language.addItems(offered_languages())
        self.language.setCurrentText("English")
        form.addRow("Speaker name", self.speaker)
        form.addRow("Language", self.language)
        hint = QLabel("The speaker name is what the exported model answers to. "
                      "The language decides the sentences the Record page offers.")
        hint.setObjectName("Muted")
        hint.setWordWrap(True)
        form.addRow(hint)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.reason = QLabel("")
        self.reason.setStyleSheet("color: #e5484d")
        self.reason.setWordWrap(True)
        self.reason.hide()
        form.addRow(self.reason)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        form.addRow(self.buttons)

    def accept(self) -> None:
        """OK with an empty name keeps the dialog open and says why."""
        if not _SAFE.sub("", self.speaker.text()).strip().strip("."):
            self.reason.setText("Type the speaker's name: it names the voice's folder and "
                                "the exported model.")
            self.reason.show()
            self.speaker.setFocus()
            return
        super().accept()


class RenameDialog(QDialog):
    """A new speaker name; the folder follows it (Ada Lovelace -> Ada-Lovelace)."""

    def __init__(self, current: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Rename voice")
        form = QFormLayout(self)
        self.name = QLineEdit(current)
        self.folder = QLabel(folder_name_for(current))
        self.folder.setObjectName("Muted")
        self.name.textChanged.connect(lambda t: self.folder.setText(folder_name_for(t)))
        form.addRow("Speaker name", self.name)
        form.addRow("Folder", self.folder)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)


class VoicesPage(Page):
    title = "Voices"
    subtitle = ("Each voice is one speaker: their recordings, training runs and models, "
                "in one folder.")
    icon_name = "voices"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.ws_label = QLabel()
        self.ws_label.setObjectName("Muted")
        self.ws_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.outer.addWidget(hbox(QLabel("<b>Workspace</b>"), self.ws_label,
                                  button("Change…", "folder", slot=self.pick_workspace),
                                  stretch_at=2))

        body = QHBoxLayout()
        body.setSpacing(16)
        left = QVBoxLayout()
        self.list = QListWidget()
        self.list.setMinimumWidth(240)
        self.list.setMaximumWidth(320)
        self.list.currentItemChanged.connect(self._selected)
        ctx.voice_kept.connect(self._show_current)  # the switch waits for Record's question
        ctx.voice_changed.connect(lambda v: v is not None and self._show_current(v))
        left.addWidget(self.list, 1)
        self.new_btn = button("New voice", "add", primary=True, slot=self.new_voice)
        self.rename_btn = button("Rename", "rename", slot=self.rename_current)
        self.delete_btn = button("Delete", "delete", danger=True, slot=self.delete_current)
        left.addWidget(hbox(self.new_btn, self.rename_btn, self.delete_btn))
        body.addLayout(left)

        right = self._build_summary()
        body.addLayout(right, 1)
        self.outer.addLayout(body, 1)
        self.new_job: EngineJob | None = None
        ctx.workspace_changed.connect(lambda _p: self.refresh())
        ctx.reader.voices_loaded.connect(self._voices_loaded)
        ctx.reader.voice_loaded.connect(self._voice_loaded)

    def _build_summary(self) -> QVBoxLayout:
        """The chosen voice's summary: its name, figures, tiers, verdict and next step."""
        right = QVBoxLayout()
        self.voice_title = QLabel("No voice selected")
        self.voice_title.setObjectName("PageTitle")
        self.voice_sub = QLabel("")
        self.voice_sub.setObjectName("Muted")
        self.voice_sub.setWordWrap(True)
        right.addWidget(self.voice_title)
        right.addWidget(self.voice_sub)
        grid = QGridLayout()
        grid.setSpacing(12)
        self.cards = {
            "takes": StatCard("takes"),
            "recorded": StatCard("minutes recorded"),
            "usable": StatCard("usable minutes (10 advised)"),
            "runs": StatCard("training runs"),
            "exports": StatCard("exported models"),
            "renders": StatCard("renders"),
        }
        for i, card in enumerate(self.cards.values()):
            grid.addWidget(card, i // 3, i % 3)
        right.addLayout(grid)
        #: the voice's tiers (instant, adapter, full) with size and base
        self.tiers = QLabel("")
        self.tiers.setObjectName("Muted")
        self.tiers.setWordWrap(True)
        right.addWidget(self.tiers)
        verdict_card = Card()
        cap = QLabel("Quality verdict")
        cap.setObjectName("StatLabel")
        self.verdict = QLabel("—")
        self.verdict.setWordWrap(True)
        verdict_card.layout_.addWidget(cap)
        verdict_card.layout_.addWidget(self.verdict)
        right.addWidget(verdict_card)
        self.empty_hint = QLabel(NEXT_STEPS_NEW)  # what the voice needs next (next_steps)
        self.empty_hint.setObjectName("Muted")
        self.empty_hint.setWordWrap(True)
        right.addWidget(self.empty_hint)
        right.addStretch(1)
        return right

    # -- workspace -----------------------------------------------------------
    def pick_workspace(self) -> None:
        start = str(self.ctx.workspace or Path.home())
        dlg = QFileDialog(self, "Choose the workspace folder", start)
        dlg.setFileMode(QFileDialog.FileMode.Directory)
        dlg.setOption(QFileDialog.Option.ShowDirsOnly, True)
        dlg.fileSelected.connect(lambda p: self.ctx.set_workspace(Path(p)))
        dlg.open()

    # -- list ----------------------------------------------------------------
    def refresh(self) -> None:
        """Show what the reader has now; it re-reads in the background and signals changes."""
        ws = self.ctx.workspace
        self.ws_label.setText(str(ws) if ws else "not chosen yet")
        if ws is not None:
            self.ctx.reader.load_voices(ws)
        self._fill_list(self.ctx.reader.cached_voices(ws) or [])
        has = self.ctx.voice is not None
        self.rename_btn.setEnabled(has)
        self.delete_btn.setEnabled(has)
        self.new_btn.setEnabled(ws is not None)
        self._show_summary(self.ctx.reader.refresh(self.ctx.voice))

    def _voices_loaded(self, workspace: Path, entries: list[VoiceEntry]) -> None:
        if workspace == self.ctx.workspace:
            self._fill_list(entries)

    def _voice_loaded(self, voice: Path, snap: VoiceSnapshot) -> None:
        for i in range(self.list.count()):  # a rename shows in the list at once
            item = self.list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == str(voice):
                item.setText(self._item_text(voice, snap.speaker))
        if voice == self.ctx.voice:
            self._show_summary(snap)

    @staticmethod
    def _item_text(path: Path, speaker: str) -> str:
        return speaker if path.name.lower() == speaker.lower() else f"{speaker}  ·  {path.name}"

    def _fill_list(self, entries: list[VoiceEntry]) -> None:
        current = self.ctx.voice
        self.list.blockSignals(True)
        self.list.clear()
        for entry in entries:
            item = QListWidgetItem(icon("voices"), self._item_text(entry.path, entry.speaker))
            item.setData(Qt.ItemDataRole.UserRole, str(entry.path))
            item.setToolTip(str(entry.path))
            self.list.addItem(item)
            if current is not None and entry.path == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def _selected(self, item: QListWidgetItem | None, _prev: QListWidgetItem | None) -> None:
        self.ctx.set_voice(Path(item.data(Qt.ItemDataRole.UserRole)) if item else None)

    def _show_current(self, voice: Path) -> None:
        """The list's selection back on `voice`, the voice still open."""
        self.list.blockSignals(True)
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == str(voice):
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def select(self, voice: Path) -> None:
        self.ctx.set_voice(voice)

    def _show_summary(self, snap: VoiceSnapshot | None) -> None:
        voice = self.ctx.voice
        if voice is None or snap is None:
            self.voice_title.setText("No voice selected" if voice is None else voice.name)
            self.voice_sub.setText("Create a voice, or pick one on the left." if voice is None
                                   else f"{voice}  ·  reading…")
            for card in self.cards.values():
                card.set("—")
            self.verdict.setText("—")
            self.tiers.setText("")
            self.empty_hint.setText(NEXT_STEPS_NEW)
            return
        s = snap.summary
        # the engine's one count of speech (SpeechCount): what Record's progress and
        # Prepare say; before a prepare, a take counts its length ("—" said nothing)
        usable = snap.minutes_in_use
        self.voice_title.setText(snap.speaker)
        # a long folder path wraps at its separators (a zero-width space after each)
        # instead of running past the page on a laptop
        shown = str(voice).replace(os.sep, os.sep + "\u200b")
        self.voice_sub.setText(shown + (f"  ·  {snap.language}" if snap.language else ""))
        self.voice_sub.setToolTip(str(voice))
        self.cards["takes"].set(str(s["takes"]))
        self.cards["recorded"].set(f"{snap.minutes_recorded:.1f}")
        self.cards["usable"].set(f"{usable:.1f}")
        self.cards["runs"].set(str(len(snap.runs)))
        self.cards["exports"].set(str(len(snap.exports)))
        self.cards["renders"].set(str(len(snap.renders)))
        self.verdict.setText(str(s["verdict"]))
        self.tiers.setText(tiers_text(list(s.get("tiers") or [])))
        self.empty_hint.setText(next_steps(snap))

    # -- create / rename / delete --------------------------------------------------
    def new_voice(self) -> NewVoiceDialog | None:
        if self.ctx.workspace is None:
            show_error(self, "No workspace", "Choose a workspace folder first.")
            return None
        dlg = NewVoiceDialog(self)
        dlg.accepted.connect(lambda: self.create_voice(dlg.speaker.text().strip(),
                                                       dlg.language.currentText()))
        dlg.open()
        return dlg

    def create_voice(self, speaker: str, language: str = "English") -> EngineJob | None:
        assert self.ctx.workspace is not None
        if not speaker:
            show_error(self, "No name", "Give the speaker a name.")
            return None
        base = folder_name_for(speaker)
        path = self.ctx.workspace / base
        n = 2
        while path.exists():
            path = self.ctx.workspace / f"{base}-{n}"
            n += 1
        job = self.start_job(["voice", "new", str(path), "--speaker", speaker,
                              "--language", language], "Create voice")
        job.succeeded.connect(lambda _r: self._created(path))
        self.new_job = job
        return job

    def _created(self, path: Path) -> None:
        self.ctx.status.emit(f"Created voice {path.name}")
        self.ctx.set_voice(path)
        self.refresh()

    def rename_current(self) -> RenameDialog | None:
        voice = self.ctx.voice
        if voice is None:
            return None
        snap = self.ctx.reader.cached(voice)
        dlg = RenameDialog(snap.speaker if snap is not None else voice.name, self)
        dlg.accepted.connect(lambda: self.rename_voice(voice, dlg.name.text()))
        dlg.open()
        return dlg

    def _busy(self, voice: Path, action: str) -> bool:
        """Refuse (with a message) while a job writes into the voice."""
        jobs = self.ctx.jobs.writing_into(voice) + [
            j for j in self.ctx.jobs.running()
            if j.voice is None and str(voice) in j.args]
        if not jobs:
            return False
        names = ", ".join(sorted({j.title for j in jobs}))
        show_error(self, f"Cannot {action} the voice", f"{names} is writing into this voice.",
                   f"Wait for it to finish, or stop it, then {action} the voice.")
        return True

    def rename_voice(self, voice: Path, new_name: str) -> Path | None:
        """Rename the speaker (voice.toml) and its folder together."""
        speaker = new_name.strip()
        if not speaker:
            show_error(self, "Cannot rename", "The new name is empty.", "Type a name.")
            return None
        if self._busy(voice, "rename"):
            return None
        if voice == self.ctx.voice and not self.ctx.may_leave_voice(
                lambda: self.rename_voice(voice, new_name)):
            return None  # a take of the voice is kept or dropped first; then it goes on
        target = voice.with_name(folder_name_for(speaker))
        if target != voice and target.exists():
            show_error(self, "Cannot rename", f"A folder named {target.name} already exists.",
                       "Pick another name.")
            return None
        try:
            if target != voice:
                voice.rename(target)
            open_voice(target).rename(speaker)  # the name the voice answers to, too
        except (OSError, VoxshardError) as exc:
            message = exc.message if isinstance(exc, VoxshardError) else \
                f"Renaming failed: {exc.strerror or exc}."
            show_error(self, "Cannot rename", message)
            return None
        self.ctx.voice = None  # force the change signal
        self.ctx.set_voice(target)
        self.ctx.notify_changed()
        self.refresh()
        return target

    def delete_current(self) -> QMessageBox | None:
        voice = self.ctx.voice
        if voice is None:
            return None
        snap = self.ctx.reader.cached(voice)
        what = (f"{snap.summary['takes']} takes ({snap.summary['minutes_recorded']:.1f} min), "
                f"{len(snap.runs)} runs and {len(snap.exports)} exported models"
                if snap is not None else "Everything")
        return self.confirm(
            "Delete voice",
            f"Delete the voice “{snap.speaker if snap else voice.name}”?",
            lambda: self.delete_voice(voice),
            detail=(f"{what} in {voice} will be moved to the trash "
                    "(or deleted where there is no trash)."),
        )

    def delete_voice(self, voice: Path) -> None:
        if self._busy(voice, "delete"):
            return
        if voice == self.ctx.voice and not self.ctx.may_leave_voice(
                lambda: self.delete_voice(voice)):
            return  # a take of the voice is kept or dropped first; then it goes on
        self.ctx.reader.forget(voice)
        if not QFile.moveToTrash(str(voice)):
            shutil.rmtree(voice, ignore_errors=True)
        if voice.exists():
            show_error(self, "Cannot delete", f"{voice} could not be removed.")
        self.ctx.set_voice(None)
        self.refresh()
