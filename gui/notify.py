"""Desktop notifications, where the desktop offers a notification service.

A long job (training, evaluation) that ends while the window is in the
background says so through the freedesktop notification service on the
session bus (GNOME, KDE, XFCE and most others provide one). The call goes
through `gdbus` (GLib's D-Bus tool, on every GTK/GNOME desktop), started
detached so the window never waits on the bus: it reads the service's own
method signature, which PySide's D-Bus bindings cannot express (an unsigned
id, an array of strings). Without a service or without `gdbus` (a bare X
server, macOS, Windows), the window asks for attention instead (taskbar
flash) and the page's own state line carries the message.
"""

from __future__ import annotations

import shutil

from PySide6.QtCore import QCoreApplication, QProcess
from PySide6.QtDBus import QDBusConnection
from PySide6.QtWidgets import QApplication, QWidget

SERVICE = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"
APP_NAME = "Voxshard"


def notification_service_available() -> bool:
    bus = QDBusConnection.sessionBus()
    if not bus.isConnected():
        return False
    iface = bus.interface()
    return bool(iface is not None and iface.isServiceRegistered(SERVICE).value())


def _gvariant_string(text: str) -> str:
    # gdbus parses each argument as GVariant text: quote it, so any text stays a string
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def notify_command(summary: str, body: str) -> list[str] | None:
    """The `gdbus call` that shows one notification (None without gdbus)."""
    gdbus = shutil.which("gdbus")
    if gdbus is None:
        return None
    # Notify(app_name s, replaces_id u, app_icon s, summary s, body s, actions as,
    #        hints a{sv}, expire_timeout i); -1: the desktop's default timeout
    return [gdbus, "call", "--session", "--dest", SERVICE, "--object-path", PATH,
            "--method", f"{SERVICE}.Notify", _gvariant_string(APP_NAME), "uint32 0",
            _gvariant_string("voxshard"), _gvariant_string(summary), _gvariant_string(body),
            "@as []", "@a{sv} {}", "int32 -1"]


def send_notification(summary: str, body: str) -> bool:
    """Show a desktop notification; False when there is no service to show it."""
    cmd = notify_command(summary, body)
    if cmd is None or not notification_service_available():
        return False
    proc = QProcess()
    proc.setProgram(cmd[0])
    proc.setArguments(cmd[1:])
    # gdbus prints the reply: not into the app's own output
    proc.setStandardOutputFile(QProcess.nullDevice())
    proc.setStandardErrorFile(QProcess.nullDevice())
    return bool(proc.startDetached())


def notify_if_in_background(widget: QWidget, summary: str, body: str) -> str:
    """Notify when the window is not the active one; returns how ("", "desktop", "alert")."""
    window = widget.window()
    if QCoreApplication.instance() is None or window.isActiveWindow():
        return ""
    if send_notification(summary, body):
        return "desktop"
    QApplication.alert(window)
    return "alert"
