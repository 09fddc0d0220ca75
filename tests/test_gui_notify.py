"""Desktop notifications reach a real freedesktop notification service on a real bus.

A private D-Bus session daemon (`dbus-daemon --session`) and a small
notification service on it (jeepney: it owns org.freedesktop.Notifications,
describes Notify by introspection as desktops do, and records each call)
stand in for the desktop; the app's code under test is unchanged. The app
side runs in its own process, so its session-bus connection is the private one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SERVICE = r'''
import json, sys
from jeepney import MessageType, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
XML = """<node><interface name="org.freedesktop.Notifications"><method name="Notify">
<arg type="s" direction="in"/><arg type="u" direction="in"/><arg type="s" direction="in"/>
<arg type="s" direction="in"/><arg type="s" direction="in"/><arg type="as" direction="in"/>
<arg type="a{sv}" direction="in"/><arg type="i" direction="in"/><arg type="u" direction="out"/>
</method></interface></node>"""
conn = open_dbus_connection(bus=sys.argv[1])
conn.send_and_get_reply(message_bus.RequestName("org.freedesktop.Notifications"))
print("ready", flush=True)
while True:
    msg = conn.receive()
    if msg.header.message_type != MessageType.method_call:
        continue
    member = msg.header.fields.get(3)
    if member == "Introspect":
        conn.send(new_method_return(msg, "s", (XML,)))
    elif member == "Notify":
        print(json.dumps({"signature": msg.header.fields.get(8), "body": list(msg.body)}),
              flush=True)
        conn.send(new_method_return(msg, "u", (1,)))
'''

APP = r'''
import sys
from PySide6.QtWidgets import QApplication, QWidget
app = QApplication([])
from gui.notify import notify_if_in_background
w = QWidget()  # never shown: a window in the background
print(notify_if_in_background(w, sys.argv[1], sys.argv[2]), flush=True)
'''


@pytest.fixture
def session_bus(tmp_path: Path):
    pytest.importorskip("jeepney")
    if not shutil.which("dbus-daemon") or not shutil.which("gdbus"):
        pytest.skip("dbus-daemon or gdbus is missing (apt-get install dbus-daemon libglib2.0-bin)")
    daemon = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1",
                               "--nopidfile"], stdout=subprocess.PIPE, text=True)
    address = daemon.stdout.readline().strip()
    yield address
    daemon.terminate()
    daemon.wait(10)


def _app_env(address: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    env.update(QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    if address:
        env["DBUS_SESSION_BUS_ADDRESS"] = address
    else:
        env["DBUS_SESSION_BUS_ADDRESS"] = "unix:path=/nonexistent/bus"
    return env


def test_a_background_window_notifies_the_desktop(session_bus: str) -> None:
    service = subprocess.Popen([sys.executable, "-c", SERVICE, session_bus],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert service.stdout.readline().strip() == "ready"
        summary, body = 'Training finished', 'Finished "ada" at step 12; loss 4.1\\ok'
        out = subprocess.run([sys.executable, "-c", APP, summary, body],
                             env=_app_env(session_bus), capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert out.stdout.strip() == "desktop", out.stderr[-2000:]
        call = json.loads(service.stdout.readline())  # gdbus runs detached: wait for it
        # exactly the freedesktop signature, and the text unchanged
        assert call["signature"] == "susssasa{sv}i"
        assert call["body"][0] == "Voxshard" and call["body"][3:5] == [summary, body]
    finally:
        service.kill()
        service.wait(10)


def test_without_a_notification_service_the_window_asks_for_attention() -> None:
    out = subprocess.run([sys.executable, "-c", APP, "Training finished", "x"],
                         env=_app_env(None), capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.stdout.strip() == "alert", out.stderr[-2000:]
