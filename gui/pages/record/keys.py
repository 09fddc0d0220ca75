"""The Record page's keys: window-wide shortcuts while the page shows (they win over a
focused button's Space), and the keys taken back after a dialog. Mixed into `RecordPage`."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QMessageBox


class RecordKeys:
    """Space, Enter, R, P, Delete, S, B and N on the Record page."""

    def take_keys_back(self) -> None:
        """After a dialog: the window active again and the focus on this page, so Space
        and the other keys reach the page (once Space pressed a button the window had
        focused instead, About, while a take ran on)."""
        if not self.isVisible():
            return
        self.window().activateWindow()
        self.setFocus(Qt.FocusReason.OtherFocusReason)

    def _after(self, box: QMessageBox) -> None:
        """The page takes its keys back once `box` is answered (after its own handler)."""
        box.finished.connect(lambda _r: QTimer.singleShot(0, self.take_keys_back))

    def _build_keys(self) -> None:
        """Window-wide while this page is shown (enabled in shown()), so the keys work
        wherever the focus is; they win over a focused button's Space."""
        self.shortcuts: list[QShortcut] = []
        for key, slot in ((Qt.Key.Key_Space, self.toggle_record),
                          (Qt.Key.Key_Return, self.accept), (Qt.Key.Key_Enter, self.accept),
                          (Qt.Key.Key_R, self.retake), (Qt.Key.Key_P, self.play),
                          (Qt.Key.Key_Delete, self.discard),
                          (Qt.Key.Key_Backspace, self.discard),
                          (Qt.Key.Key_S, self.skip), (Qt.Key.Key_B, self.back),
                          (Qt.Key.Key_N, self.next_style)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.activated.connect(slot)
            sc.setEnabled(False)
            self.shortcuts.append(sc)

    def _enable_keys(self, on: bool) -> None:
        for sc in self.shortcuts:
            sc.setEnabled(on)
