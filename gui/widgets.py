"""Small widgets shared by the pages."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, QEvent, QObject, QRectF, Qt, QTimer, QUrl
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QLinearGradient,
    QPainter,
    QPainterPath,
    QPalette,
    QShowEvent,
    QTextOption,
    QValidator,
)
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QAbstractSpinBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSlider,
    QStyle,
    QStyleOptionComboBox,
    QVBoxLayout,
    QWidget,
)

from gui.audio import envelope
from gui.theme import SERIES, icon


def page_header(title: str, subtitle: str) -> QWidget:
    box = QWidget()
    lay = QVBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 8)
    lay.setSpacing(2)
    t = QLabel(title)
    t.setObjectName("PageTitle")
    s = QLabel(subtitle)
    s.setObjectName("PageSubtitle")
    s.setWordWrap(True)
    lay.addWidget(t)
    lay.addWidget(s)
    return box


def button(text: str, icon_name: str | None = None, *, primary: bool = False,
           danger: bool = False, tip: str = "", slot: Callable[[], object] | None = None
           ) -> QPushButton:
    b = QPushButton(text)
    if icon_name:
        b.setProperty("icon_name", icon_name)
        b.setIcon(icon(icon_name, "#ffffff" if primary else None))
    if primary:
        b.setProperty("primary", True)
    if danger:
        b.setProperty("danger", True)
    if tip:
        b.setToolTip(tip)
    if slot is not None:
        b.clicked.connect(slot)
    b.setCursor(Qt.CursorShape.PointingHandCursor)
    return b


def retint_buttons(root: QWidget) -> None:
    """Re-draw icon buttons in the current theme's colours."""
    for b in root.findChildren(QPushButton):
        name = b.property("icon_name")
        if name:
            b.setIcon(icon(str(name), "#ffffff" if b.property("primary") else None))


class Card(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Card")
        self.layout_ = QVBoxLayout(self)
        self.layout_.setContentsMargins(14, 12, 14, 12)


class StatCard(Card):
    """A number with a label underneath (minutes, takes, runs...)."""

    def __init__(self, label: str, value: str = "—", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.value = QLabel(value)
        self.value.setObjectName("StatValue")
        self.label = QLabel(label)
        self.label.setObjectName("StatLabel")
        self.label.setWordWrap(True)  # at the window's minimum width it takes two lines
        self.layout_.addWidget(self.value)
        self.layout_.addWidget(self.label)

    def set(self, value: str) -> None:
        self.value.setText(value)


def show_error(parent: QWidget | None, title: str, message: str, hint: str = "") -> QMessageBox:
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle(title)
    box.setText(message)
    if hint:
        box.setInformativeText(hint)
    box.setStandardButtons(QMessageBox.StandardButton.Ok)
    box.open()  # not exec(): never a nested event loop
    return box


def fmt_duration(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "—"
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LevelMeter(QWidget):
    """Horizontal input meter in dBFS with a peak hold and a clip lamp."""

    FLOOR_DB = -60.0

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._level = 0.0  # 0..1 on the dB scale
        self._hold = 0.0
        self.clipping = False
        self._decay = QTimer(self)
        self._decay.setInterval(50)
        self._decay.timeout.connect(self._fall)

    @staticmethod
    def to_fraction(amplitude: float) -> float:
        if amplitude <= 0:
            return 0.0
        db = 20 * math.log10(max(amplitude, 1e-9))
        return max(0.0, min(1.0, (db - LevelMeter.FLOOR_DB) / -LevelMeter.FLOOR_DB))

    def set_level(self, peak: float, clipped: bool = False) -> None:
        frac = self.to_fraction(peak)
        self._level = max(frac, self._level * 0.85)
        self._hold = max(self._hold, frac)
        self.clipping = self.clipping or clipped
        if not self._decay.isActive():
            self._decay.start()
        self.update()

    def reset(self) -> None:
        self._level = self._hold = 0.0
        self.clipping = False
        self._decay.stop()
        self.update()

    def level(self) -> float:
        return self._level

    def _fall(self) -> None:
        self._hold = max(self._level, self._hold - 0.01)
        if self._level == 0 and self._hold == 0:
            self._decay.stop()
        self.update()

    def hideEvent(self, event: object) -> None:
        self._decay.stop()

    def paintEvent(self, event: object) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        base = self.palette().color(QPalette.ColorRole.AlternateBase)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(base)
        p.drawRoundedRect(r, 5, 5)
        grad = QLinearGradient(r.left(), 0, r.right(), 0)
        grad.setColorAt(0.0, QColor("#3fb950"))
        grad.setColorAt(0.75, QColor("#3fb950"))
        grad.setColorAt(0.88, QColor("#f5a524"))
        grad.setColorAt(1.0, QColor("#e5484d"))
        fill = QRectF(r.left(), r.top(), r.width() * self._level, r.height())
        p.setBrush(grad)
        p.drawRoundedRect(fill, 5, 5)
        x = r.left() + r.width() * self._hold
        p.setPen(QColor("#e5484d" if self._hold > 0.97 else "#f0f0f0"))
        p.drawLine(int(x), int(r.top() + 2), int(x), int(r.bottom() - 2))
        # -12 and -3 dBFS ticks: where speech should peak
        p.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
        for db in (-12.0, -3.0):
            tx = r.left() + r.width() * (db - self.FLOOR_DB) / -self.FLOOR_DB
            p.drawLine(int(tx), int(r.bottom() - 5), int(tx), int(r.bottom()))
        p.end()


class WaveformView(pg.PlotWidget):
    """A take's waveform as a min/max envelope (fast for any length)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.setYRange(-1, 1)
        self.getPlotItem().hideAxis("left")
        self.setLabel("bottom", "seconds")
        self.getPlotItem().getAxis("bottom").enableAutoSIPrefix(False)
        self.getPlotItem().hideAxis("bottom")  # no audio, no time axis ("-400 ms" meant nothing)
        self.empty_text = pg.TextItem("No take yet: press Record", color="#8a8f98",
                                      anchor=(0.5, 0.5))
        self.addItem(self.empty_text)
        self.setXRange(0, 1, padding=0)
        self.empty_text.setPos(0.5, 0.0)
        color = QColor(SERIES[0])
        self._hi = self.plot(pen=pg.mkPen(color, width=1))
        self._lo = self.plot(pen=pg.mkPen(color, width=1))
        fill_color = QColor(color)
        fill_color.setAlpha(110)
        self._fill = pg.FillBetweenItem(self._hi, self._lo, brush=pg.mkBrush(fill_color))
        self.addItem(self._fill)
        # the Record page at the window's minimum size, in the theme, has 90 px for it
        self.setMinimumHeight(90)

    def show_audio(self, audio: np.ndarray, samplerate: int) -> None:
        t, lo, hi = envelope(np.asarray(audio, dtype=np.float32), samplerate)
        self._hi.setData(t, hi)
        self._lo.setData(t, lo)
        self.empty_text.hide()
        self.getPlotItem().showAxis("bottom")
        self.setXRange(0, max(float(t[-1]) if len(t) else 0.0, 0.1), padding=0.01)

    def clear_audio(self) -> None:
        self._hi.setData([], [])
        self._lo.setData([], [])
        self._fill.setPath(QPainterPath())  # the fill keeps its last shape otherwise
        self.getPlotItem().hideAxis("bottom")
        self.setXRange(0, 1, padding=0)
        self.empty_text.show()


def hbox(*widgets: QWidget | None, stretch_at: int | None = None, spacing: int = 8) -> QWidget:
    w = QWidget()
    lay = QHBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(spacing)
    for i, child in enumerate(widgets):
        if i == stretch_at:
            lay.addStretch(1)
        if child is not None:
            lay.addWidget(child)
    if stretch_at is not None and stretch_at >= len(widgets):
        lay.addStretch(1)
    return w


def vbox(*widgets: QWidget, spacing: int = 4) -> QWidget:
    """Widgets one above the other, with no margins of its own (as `hbox`)."""
    w = QWidget()
    lay = QVBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(spacing)
    for child in widgets:
        lay.addWidget(child)
    return w


#: inputs a wheel would change: they take it only once clicked or tabbed into
WHEEL_INPUTS = (QAbstractSpinBox, QComboBox, QSlider)


class WheelGuard(QObject):
    """App-wide: the mouse wheel over an unfocused spin box, combo box or slider scrolls
    the page around it instead of changing the value (a user scrolling a form changed
    "Checkpoint every" from 10 to 1 without noticing). Click or tab into the input to
    wheel it.

    Qt gives a widget with `Qt.WheelFocus` the focus before any filter sees a real wheel
    event, so a `hasFocus()` test alone passes for every wheel that arrives through the
    window system: such inputs are polished with `Qt.StrongFocus` instead."""

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind == QEvent.Type.Polish and isinstance(obj, WHEEL_INPUTS) \
                and obj.focusPolicy() == Qt.FocusPolicy.WheelFocus:
            obj.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        elif kind == QEvent.Type.Wheel and isinstance(obj, WHEEL_INPUTS) \
                and not obj.hasFocus():
            area = _scroll_area_of(obj)
            if area is not None:
                # to the viewport, which hands it to the scroll bar (sent to the parent, a
                # real wheel's copy was dropped: Qt propagates only spontaneous events)
                QCoreApplication.sendEvent(area.viewport(), event)
            event.accept()  # nothing further up changes either (the Run selector's page)
            return True
        return False


def _scroll_area_of(widget: QWidget) -> QAbstractScrollArea | None:
    w = widget.parentWidget()
    while w is not None and not isinstance(w, QAbstractScrollArea):
        w = w.parentWidget()
    return w


def install_wheel_guard(app: QObject) -> WheelGuard:
    """Install the guard once on `app` (the QApplication); returns it."""
    guard = app.findChild(WheelGuard)
    if guard is None:
        guard = WheelGuard(app)
        app.installEventFilter(guard)
    return guard


class ElidedComboBox(QComboBox):
    """A combo box whose label, wider than the box, ends in "…" (the open list says it
    whole): clipped, it was cut mid-word ("(step 200/200, 2 che")."""

    def initStyleOption(self, option: QStyleOptionComboBox) -> None:
        super().initStyleOption(option)
        room = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                           QStyle.SubControl.SC_ComboBoxEditField, self)
        option.currentText = self.fontMetrics().elidedText(
            option.currentText, Qt.TextElideMode.ElideRight, room.width() - 2)


class SciSpinBox(QDoubleSpinBox):
    """A small positive value in scientific notation ("2.0e-06"), which a learning rate
    reads as; typing "3e-5" or "0.00003" both work. Steps multiply/divide by ~2."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setDecimals(12)  # storage precision; the text shows 2 significant digits

    def textFromValue(self, value: float) -> str:
        return f"{value:.1e}"

    def valueFromText(self, text: str) -> float:
        try:
            return float(text.strip())
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int) -> object:
        t = text.strip()
        if not t:
            return QValidator.State.Intermediate, text, pos
        try:
            v = float(t)
        except ValueError:
            ok = all(c in "0123456789.eE-+" for c in t)
            return (QValidator.State.Intermediate if ok else QValidator.State.Invalid), text, pos
        state = QValidator.State.Acceptable if self.minimum() <= v <= self.maximum() \
            else QValidator.State.Intermediate
        return state, text, pos

    def stepBy(self, steps: int) -> None:
        self.setValue(self.value() * (2.0 ** steps))


class LogView(QPlainTextEdit):
    """A read-only, bounded log that follows new lines while it is scrolled to the end,
    and stays where the user scrolled to read an older line.

    QPlainTextEdit follows only while it is visible: lines added while the log sat in a
    hidden tab left it above the end, and it stopped following for good (issue 28)."""

    def __init__(self, max_lines: int = 3000, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(max_lines)  # bounded, however long the job
        self.following = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        # the range grows after the text is laid out: keep the end in view then too
        bar.rangeChanged.connect(lambda _lo, _hi: self._follow())

    def _scrolled(self, value: int) -> None:
        if self.isVisible():  # only the user's scroll decides, not a hidden re-layout
            self.following = value >= self.verticalScrollBar().maximum()

    def _follow(self) -> None:
        if self.following:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    def append_line(self, text: str) -> None:
        self.appendPlainText(text)
        self._follow()

    def clear(self) -> None:
        """Empty, and following again (a new job's lines from its first)."""
        super().clear()
        self.following = True

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._follow()


def open_in_desktop(parent: QWidget, path: Path, what: str) -> bool:
    """Open `path` (a report, a folder) with the desktop's program for it. When none can
    start (no browser, no xdg-open), say so in a box that names the path and offers its
    folder, instead of doing nothing (issue 28)."""
    if QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
        return True
    box = QMessageBox(QMessageBox.Icon.Warning, f"Could not open the {what}",
                      f"No program on this computer could open the {what}:\n{path}",
                      QMessageBox.StandardButton.Close, parent)
    box.setInformativeText("Open its folder and the file from there, or copy the path above "
                           "into a browser or file manager.")
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if path.parent != path and not path.is_dir():
        folder = box.addButton("Open folder", QMessageBox.ButtonRole.ActionRole)
        folder.clicked.disconnect()  # the box stays open: it still holds the path

        def open_folder() -> None:
            if QDesktopServices.openUrl(QUrl.fromLocalFile(str(path.parent))):
                box.done(0)
            else:
                folder.setEnabled(False)
                box.setInformativeText(f"The folder {path.parent} could not be opened either: "
                                       "no file manager is set up. Copy the path above.")

        folder.clicked.connect(open_folder)
    box.open()
    return False


class HowToDialog(QDialog):
    """A message with text to copy (commands, paths): the text wraps anywhere inside the
    dialog, so a long path is never cut at its right edge (a QMessageBox's label wraps at
    spaces only), and it stays selectable as it is, without inserted break characters."""

    def __init__(self, title: str, text: str, howto: str, parent: QWidget | None = None
                 ) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        lay = QVBoxLayout(self)
        self.label = QLabel(text)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.label)
        self.howto = QPlainTextEdit(howto)
        self.howto.setReadOnly(True)
        self.howto.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.howto.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        lay.addWidget(self.howto, 1)
        self.button_box = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.button_box.rejected.connect(self.reject)
        lay.addWidget(self.button_box)
        self.resize(640, 320)

    def add_action(self, text: str, action: Callable[[], object]) -> QPushButton:
        """A button that acts and leaves the dialog open (Open folder)."""
        button = self.button_box.addButton(text, QDialogButtonBox.ButtonRole.ActionRole)
        button.clicked.connect(lambda: action())
        return button
