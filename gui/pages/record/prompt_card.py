"""The prompt card: which sentence is read next, the set and groups the voice reads (and
the language question a set in another language asks), the minutes recorded and the
styles that still need takes. Mixed into `RecordPage`, whose widgets and state it uses."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QComboBox, QLabel, QMenu, QMessageBox, QToolButton

from engine.catalog import VoiceSnapshot
from engine.core.errors import VoxshardError
from engine.layout.prompts import StyleCount, get_prompt_set, list_prompt_sets, style_counts
from engine.layout.voice import VERDICT_UNUSABLE, open_voice, take_verdict
from gui.widgets import Card, hbox, show_error


class PromptCard:
    """The prompt card's part of the Record page."""

    def _build_prompt_card(self) -> None:
        card = Card()
        # which sentences to read: the set, and optionally only some of its groups
        self.set_combo = QComboBox()
        self.set_combo.setToolTip("The sentences to read (saved with the voice)")
        self.set_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.set_combo.activated.connect(self._set_chosen)
        self.groups_btn = QToolButton()
        self.groups_btn.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.groups_btn.setToolTip("Read only some groups of the set (saved with the voice)")
        self.groups_menu = QMenu(self.groups_btn)
        self.groups_btn.setMenu(self.groups_menu)
        self.groups_btn.setText("Groups: all")
        self.prompt_meta = QLabel("")
        self.prompt_meta.setObjectName("PromptMeta")
        # a style prompt's line is long: it wraps rather than squeeze the set's name
        self.prompt_meta.setWordWrap(True)
        self.prompt_label = QLabel("Open a voice to start recording.")
        self.prompt_label.setObjectName("Prompt")
        self.prompt_label.setWordWrap(True)
        self.prompt_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        # two lines of the theme's 22pt prompt and its 18 px padding: 150 px left the page
        # taller than the window at its minimum size, and the card cut the prompt off
        self.prompt_label.setMinimumHeight(110)
        meta_row = hbox(self.prompt_meta, self.set_combo, self.groups_btn)
        meta_row.layout().setStretch(0, 1)  # the line takes the room left, wrapping past it
        card.layout_.addWidget(meta_row)
        card.layout_.addWidget(self.prompt_label, 1)
        self.outer.addWidget(card, 2)

    # -- prompt ------------------------------------------------------------------
    def _show_snapshot(self, snap: VoiceSnapshot | None) -> None:
        if self.recorder.active and not self.testing:
            return  # never pull the prompt from under a running take
        if self.voice is None:
            self.prompt = None
            self.prompt_label.setText("Open or create a voice on the Voices page first.")
            self.prompt_meta.setText("")
        elif snap is None:
            self.prompt = None
            self.prompt_label.setText("Reading the voice…")
            self.prompt_meta.setText("")
        else:
            # a take accepted a moment ago counts even before the re-read reaches here;
            # an unusable take's prompt is read again (engine: Take.fills_prompt)
            done = {t.prompt_id for t in snap.takes
                    if t.prompt_id and take_verdict(t.extra) != VERDICT_UNUSABLE}
            self.prompts.load(*self._prompt_choice(snap),
                              done | self.accepted.get(self.voice, set()))
            in_set = self.prompt is not None and any(p.id == self.prompt.id
                                                     for p in self.prompts.prompts)
            if not in_set or (self.prompts.is_done(self.prompt) and not self.revisiting
                              and self.take_audio is None):
                self.prompt = self.prompts.next()
            self._show_prompt()
        self._fill_prompt_choice(snap)
        self._update_progress(snap)
        self._show_styles()
        self._update_buttons()

    def _prompt_choice(self, snap: VoiceSnapshot) -> tuple[str, tuple[str, ...]]:
        """The set and groups to read: the snapshot's, unless this page has just chosen
        others and the snapshot was read before that reached the disk."""
        read = (snap.prompt_set, tuple(snap.prompt_groups))
        if self._pending_choice is None or self._pending_choice == read:
            self._pending_choice = None
            return read
        return self._pending_choice

    def _show_prompt(self) -> None:
        if self.prompt is None:
            self.prompt_label.setText(self.prompts.error or
                                      "Every prompt of this set is recorded. Well done!")
            self.prompt_meta.setText("")
            return
        done, total = self.prompts.counts()
        self.prompt_label.setText(self.prompt.text)
        again = ("  ·  recorded already: a new take replaces it"
                 if self.prompts.is_done(self.prompt) else "")
        cue = self.prompt.cue or self.prompt.style  # in the set's language
        style = f"  ·  read it this way: {cue}" if cue else ""
        self.prompt_meta.setText(f"Prompt {self.prompt.id}  ·  {self.prompt.group}  ·  "
                                 f"{done} of {total} recorded{again}{style}")

    def _fill_prompt_choice(self, snap: VoiceSnapshot | None) -> None:
        """The set and group pickers show what the voice reads."""
        self.set_combo.blockSignals(True)
        self.set_combo.clear()
        if snap is not None:
            try:
                sets = list_prompt_sets()
            except VoxshardError:
                sets = []
            for ps in sets:
                self.set_combo.addItem(f"{ps.title or ps.name} ({len(ps)})", ps.name)
            i = self.set_combo.findData(self.prompts.set_name)
            self.set_combo.setCurrentIndex(i)
        self.set_combo.blockSignals(False)
        groups = self.prompts.all_groups if snap is not None else []
        if [a.text() for a in self.groups_menu.actions()] != groups:
            # rebuilt only when the set's groups differ: never under a toggling action
            self.groups_menu.clear()
            for group in groups:
                act = QAction(group, self.groups_menu)
                act.setCheckable(True)
                act.toggled.connect(lambda _on, g=group: self._group_toggled(g))
                self.groups_menu.addAction(act)
        chosen = set(self.prompts.groups)
        for act in self.groups_menu.actions():
            act.blockSignals(True)
            act.setChecked(not chosen or act.text() in chosen)
            act.blockSignals(False)
        every = not chosen or chosen >= set(self.prompts.all_groups)
        self.groups_btn.setText("Groups: all" if every else f"Groups: {len(chosen)} of "
                                f"{len(self.prompts.all_groups)}")

    def _set_chosen(self, _i: int) -> None:
        name = self.set_combo.currentData()
        if not name or name == self.prompts.set_name or self.voice is None:
            return
        try:
            voice = open_voice(self.voice)
            language = get_prompt_set(str(name)).language.strip().lower()
        except VoxshardError as exc:
            self._after(show_error(self, "The prompts were not changed", exc.message,
                                   exc.hint or ""))
            return
        if not language or language == voice.language.strip().lower():
            self._save_prompt_choice(str(name), [])
            return
        self._ask_language(str(name), language, voice.language, voice.display_name)

    def _ask_language(self, set_name: str, language: str, current: str, who: str) -> None:
        """A set in another language: its takes are judged and trained in the voice's
        language, so the voice changes with it, or the set does not."""
        box = QMessageBox(QMessageBox.Icon.Question, "Read sentences in another language?",
                          f"These sentences are in {language.capitalize()}; {who} speaks "
                          f"{current.capitalize()}. Change {who}'s language to "
                          f"{language.capitalize()}?", QMessageBox.StandardButton.NoButton,
                          self)
        change = box.addButton(f"Change to {language.capitalize()}",
                               QMessageBox.ButtonRole.AcceptRole)
        keep = box.addButton(f"Keep {current.capitalize()}", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)
        box.setEscapeButton(keep)
        box.setInformativeText("Takes are checked and trained in the voice's language: "
                               "a voice reads one language.")
        self._language_box = box

        def answered(_r: int) -> None:
            self._language_box = None
            if box.clickedButton() is change and self.voice is not None:
                try:
                    open_voice(self.voice).set_language(language)
                except VoxshardError as exc:
                    self._after(show_error(self, "The language was not changed",
                                           exc.message, exc.hint or ""))
                    return
                self._save_prompt_choice(set_name, [])
            else:  # the picker shows the set still read
                self._fill_prompt_choice(self.ctx.reader.cached(self.voice)
                                         if self.voice else None)

        box.finished.connect(answered)
        self._after(box)
        box.open()

    def _group_toggled(self, group: str) -> None:
        every = self.prompts.all_groups
        chosen = set(self.prompts.groups or every)
        chosen ^= {group}
        if not chosen:
            self._set_state("Keep at least one group ticked: there would be nothing to read.",
                            warn=True)
            self._fill_prompt_choice(self.ctx.reader.cached(self.voice) if self.voice else None)
            return
        self._save_prompt_choice(self.prompts.set_name, [g for g in every if g in chosen])

    def _save_prompt_choice(self, set_name: str, groups: list[str]) -> None:
        """Store the set and groups in voice.toml; the next prompt comes from them."""
        if self.voice is None or (self.recorder.active and not self.testing):
            return
        try:
            voice = open_voice(self.voice)
            voice.set_prompts(set_name, groups)
        except VoxshardError as exc:
            self._after(show_error(self, "The prompts were not changed", exc.message,
                                   exc.hint or ""))
            return
        self._pending_choice = (voice.prompt_set, tuple(voice.prompt_groups))
        self._reset_take()
        self.revisiting = False
        self.prompt = None  # the first unrecorded prompt of the new choice
        self._show_snapshot(self.ctx.reader.cached(self.voice))
        self._set_state("Ready: Space to record")
        self.ctx.notify_changed()

    def _update_progress(self, snap: VoiceSnapshot | None) -> None:
        if self.voice is None or snap is None:
            self.progress.setValue(0)
            self.progress_label.setText("")
            return
        # Prepare's count (engine.layout.manifest.SpeechCount), not the takes' raw length:
        # a silent take, a take left out and trailing silence count nothing toward it
        minutes = snap.minutes_in_use
        target = float(snap.summary["recommended_minutes"])
        self.progress.setValue(int(min(1.0, minutes / target) * 1000))
        self.progress.setFormat(f"{minutes:.1f} of {target:.0f} min")
        self.progress_label.setText(
            f"{minutes:.1f} minutes of usable speech recorded · "
            f"{max(0.0, target - minutes):.1f} more recommended" if minutes < target
            else f"{minutes:.1f} minutes of usable speech recorded · enough to train")

    def styles(self) -> list[StyleCount]:
        """The takes per style of the prompts read (the engine's count, with the takes
        accepted here that the snapshot may not show yet)."""
        return style_counts(self.prompts.prompts, self.prompts.done) if self.voice else []

    def _show_styles(self) -> None:
        counts = self.styles()
        self.style_label.setText("Styles: " + " · ".join(
            f"{c.group} {c.recorded}/{c.total}" for c in counts) if counts else "")
        self.style_btn.setVisible(bool(counts))  # a set without styles: nothing to go to
        self.style_label.setToolTip("\n".join(
            f"{c.group}: {c.style} {c.recorded} of {c.total} recorded" for c in counts))

    def next_style(self) -> None:
        """The first unrecorded prompt of the next style still needing takes (after the
        shown prompt's style, in set order, wrapping around)."""
        if self.recorder.active:
            return
        needing = [c for c in self.styles() if c.next_id]
        if not needing:
            return
        styles = [c.style for c in self.styles()]
        at = styles.index(self.prompt.style) if self.prompt and self.prompt.style in styles \
            else -1
        after = [c for c in needing if styles.index(c.style) > at]
        target = (after or needing)[0].next_id
        self._reset_take()
        self.revisiting = False
        self.prompt = next((p for p in self.prompts.prompts if p.id == target), self.prompt)
        self._show_prompt()
        self._set_state("Ready: Space to record")
        self._update_buttons()

