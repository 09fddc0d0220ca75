"""Where the main window opens: inside the screen's free area, at the size it was left at.

The window opened at 1320x860 on a 1100x760 laptop screen, partly off it, and forgot
any size it was given (issue 28). Now it remembers its place in the settings and checks
the remembered place against the screens there are now: a place saved on a larger or
unplugged monitor is moved and shrunk onto the current one.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSettings, QSize
from PySide6.QtGui import QGuiApplication, QScreen

#: the size the window asks for on a screen with room for it
DEFAULT_SIZE = QSize(1320, 860)
#: the smallest window every page fits without cutting text (tests/test_gui_fit.py)
MINIMUM_SIZE = QSize(1024, 680)
#: room kept for the window manager's title bar below the screen's free area, since the
#: window's frame is only known once it is shown
FRAME_ALLOWANCE = QSize(0, 32)

GEOMETRY_KEY = "window/geometry"  # the frame's top-left and the window's size
MAXIMIZED_KEY = "window/maximized"


def _bounded(size: QSize, low: QSize, high: QSize) -> QSize:
    return QSize(max(low.width(), min(size.width(), high.width())),
                 max(low.height(), min(size.height(), high.height())))


def minimum_for(available: QRect) -> QSize:
    """The window's minimum size on a screen whose free area is `available`: never larger
    than that area, or the window could not be placed on it at all."""
    return MINIMUM_SIZE.boundedTo(available.size())


def fit(saved: QRect | None, available: QRect) -> QRect:
    """The window's place: `saved` (top-left of its frame, size) when it lies on the free
    area `available`, else moved and shrunk onto it; without `saved`, the default size
    (or the area's, if smaller) in the middle of the area."""
    room = available.size() - FRAME_ALLOWANCE
    low = minimum_for(QRect(available.topLeft(), room))
    if saved is None or not saved.isValid():
        size = _bounded(DEFAULT_SIZE, low, room)
        top_left = available.center() - QPoint(size.width() // 2, size.height() // 2)
        top_left = QPoint(max(available.left(), top_left.x()), max(available.top(), top_left.y()))
        return QRect(top_left, size)
    size = _bounded(saved.size(), low, room)
    # the whole window on the area: pushed left/up when it hangs over the right/bottom
    x = min(max(saved.x(), available.left()), available.left() + room.width() - size.width())
    y = min(max(saved.y(), available.top()), available.top() + room.height() - size.height())
    return QRect(QPoint(x, y), size)


def screen_for(saved: QRect | None) -> QScreen:
    """The screen a saved place lies on (its centre), else the primary screen."""
    if saved is not None and saved.isValid():
        screen = QGuiApplication.screenAt(saved.center())
        if screen is not None:
            return screen
    return QGuiApplication.primaryScreen()


def saved_place(settings: QSettings) -> tuple[QRect | None, bool]:
    """The place the window was left at (or None) and whether it was maximized."""
    value = settings.value(GEOMETRY_KEY)
    rect = value if isinstance(value, QRect) and value.isValid() else None
    maximized = str(settings.value(MAXIMIZED_KEY, "false")).lower() == "true"
    return rect, maximized


def remember(settings: QSettings, place: QRect, maximized: bool) -> None:
    settings.setValue(GEOMETRY_KEY, place)
    settings.setValue(MAXIMIZED_KEY, maximized)
