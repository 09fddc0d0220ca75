"""Dark and light themes that follow the system, and icons tinted to match.

The style sheet in assets/style/voxshard.qss is a template: `{name}` fields
are filled from the active `Theme`, so both themes share one sheet.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import platformdirs
import pyqtgraph as pg
from PySide6.QtCore import QByteArray, QObject, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

from gui.paths import icon_path, style_path


@dataclass(frozen=True)
class Theme:
    name: str
    window: str
    surface: str
    surface_alt: str
    border: str
    text: str
    text_muted: str
    accent: str
    accent_text: str
    danger: str
    warning: str
    ok: str
    sidebar: str
    selection: str


DARK = Theme(
    name="dark", window="#16181d", surface="#1e2128", surface_alt="#262a33",
    border="#323744", text="#e6e8ee", text_muted="#9aa1b2", accent="#7c6cff",
    accent_text="#ffffff", danger="#f2555a", warning="#f5a524", ok="#3fb950",
    sidebar="#111317", selection="#3a3470",
)
LIGHT = Theme(
    name="light", window="#f4f5f8", surface="#ffffff", surface_alt="#eef0f4",
    border="#d8dbe3", text="#1b1e25", text_muted="#5d6475", accent="#5b4bf0",
    accent_text="#ffffff", danger="#d92d35", warning="#b86e00", ok="#1f8a3b",
    sidebar="#e9ebf1", selection="#dcd8ff",
)

# Colours of plot series, readable on both backgrounds.
SERIES = ["#7c6cff", "#1fb6c9", "#f5a524", "#e5484d", "#3fb950", "#d16ba5", "#8e9aaf"]


def system_prefers_dark() -> bool:
    app = QGuiApplication.instance()
    if app is None:
        return False
    scheme = QGuiApplication.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    # unknown (e.g. offscreen): judge by the default palette's window colour
    return QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 128


class ThemeManager(QObject):
    """Applies a theme to the application and re-applies it when the system changes."""

    changed = Signal(object)

    def __init__(self, app: QApplication, mode: str = "system") -> None:
        super().__init__(app)
        self.app = app
        self.mode = mode
        self.theme = DARK
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._system_changed)

    def _system_changed(self, *_: object) -> None:
        if self.mode == "system":
            self.apply()

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.apply()

    def apply(self) -> Theme:
        if self.mode == "dark":
            theme = DARK
        elif self.mode == "light":
            theme = LIGHT
        else:
            theme = DARK if system_prefers_dark() else LIGHT
        self.theme = theme
        apply_theme(self.app, theme)
        self.changed.emit(theme)
        return theme


def _palette(t: Theme) -> QPalette:
    p = QPalette()
    c = QColor
    roles = QPalette.ColorRole
    p.setColor(roles.Window, c(t.window))
    p.setColor(roles.WindowText, c(t.text))
    p.setColor(roles.Base, c(t.surface))
    p.setColor(roles.AlternateBase, c(t.surface_alt))
    p.setColor(roles.ToolTipBase, c(t.surface_alt))
    p.setColor(roles.ToolTipText, c(t.text))
    p.setColor(roles.PlaceholderText, c(t.text_muted))
    p.setColor(roles.Text, c(t.text))
    p.setColor(roles.Button, c(t.surface_alt))
    p.setColor(roles.ButtonText, c(t.text))
    p.setColor(roles.BrightText, c(t.danger))
    p.setColor(roles.Highlight, c(t.accent))
    p.setColor(roles.HighlightedText, c(t.accent_text))
    p.setColor(roles.Link, c(t.accent))
    for role in (roles.Text, roles.ButtonText, roles.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, c(t.text_muted))
    return p


def tinted_svg(name: str, color: str) -> Path:
    """An icon as an SVG file in one colour, for style sheets (`url()` takes only files).

    Kept in the user's cache folder, named by colour, so each theme writes it once.
    """
    folder = Path(platformdirs.user_cache_dir("Voxshard")) / "style"
    target = folder / f"{name}-{color.lstrip('#')}.svg"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.write_bytes(_svg_bytes(name).replace(b"currentColor", color.encode()))
        os.replace(tmp, target)  # another process writing the same file is harmless
    return target


def style_sheet(theme: Theme) -> str:
    """The style sheet template filled with a theme's colours and arrow images."""
    fields = dict(asdict(theme))
    for key, name in (("arrow_up", "chevron-up"), ("arrow_down", "chevron-down")):
        try:
            fields[key] = tinted_svg(name, theme.text).as_posix()
            fields[f"{key}_off"] = tinted_svg(name, theme.border).as_posix()
        except OSError:  # no writable cache: Qt's own (invisible) arrows, nothing worse
            fields[key] = fields[f"{key}_off"] = ""
    sheet = style_path().read_text(encoding="utf-8")
    for key, value in fields.items():
        sheet = sheet.replace("{" + key + "}", value)
    return sheet


def apply_theme(app: QApplication, theme: Theme) -> None:
    # antialiasing costs ~3x the paint time of the live charts; lines stay crisp without it
    pg.setConfigOptions(antialias=False, background=theme.surface, foreground=theme.text_muted)
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")  # re-polishes every widget: only once
    palette, sheet = _palette(theme), style_sheet(theme)
    if app.styleSheet() == sheet and app.palette() == palette:
        return  # the same theme again (a system change that keeps it): re-polishing every
        # live widget for nothing costs more the more widgets live
    app.setPalette(palette)
    app.setStyleSheet(sheet)


@lru_cache(maxsize=256)
def _svg_bytes(name: str) -> bytes:
    return icon_path(name).read_bytes()


def icon(name: str, color: str | None = None, size: int = 48) -> QIcon:
    """An icon from assets/icons, drawn in `color` (default: the theme's text)."""
    svg = _svg_bytes(name)
    if color is None:
        app = QApplication.instance()
        color = (app.palette().color(QPalette.ColorRole.WindowText).name()  # type: ignore[union-attr]
                 if app else "#888888")
    result = QIcon(_tinted_pixmap(svg, color, size))
    # a disabled button's icon in the muted text colour: Fusion's generated one
    # stays nearly as bright as the enabled icon on a dark theme
    app = QApplication.instance()
    if app is not None:
        muted = app.palette().color(QPalette.ColorGroup.Disabled,  # type: ignore[union-attr]
                                    QPalette.ColorRole.WindowText).name()
        result.addPixmap(_tinted_pixmap(svg, muted, size), QIcon.Mode.Disabled)
    return result


def _tinted_pixmap(svg: bytes, color: str, size: int) -> QPixmap:
    renderer = QSvgRenderer(QByteArray(svg.replace(b"currentColor", color.encode())))
    pix = QPixmap(size, size)
    pix.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pix)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return pix


def app_icon() -> QIcon:
    return QIcon(str(icon_path("voxshard")))
