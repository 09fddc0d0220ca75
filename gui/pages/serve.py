"""Serve: the voices to other programs, through OpenAI's speech endpoint.

The server is `voxshard-engine --json serve` in its own process (an `EngineJob`,
so it shows in the status bar with a Cancel, and Quit stops it cleanly); the
window only reads its events, so it never waits on the server. A key is made
for each start when it is asked for (always off this computer): it is shown
once, copied to the clipboard, and lives in a private temporary file that is
removed when the server stops.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from engine import catalog
from engine.config.schema import flag_of
from engine.config.serve import WYOMING_PORT, ServeSettings
from engine.core.errors import InputError
from engine.serve.server import url_of
from engine.serve.voices import discover, servable, serving_base
from engine.serve.wyoming import announced_address, home_assistant_list
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.pages.base import Page
from gui.served_speech import ServedEndpoint
from gui.settings_form import SettingField
from gui.widgets import button, hbox, vbox
from gui.words import count

HOSTS = [("Only this computer (127.0.0.1)", "127.0.0.1"),
         ("Other computers too (0.0.0.0, needs the key)", "0.0.0.0")]
#: rows kept in the request log (older ones scroll away)
LOG_ROWS = 500
#: the audio-seconds-per-second figure averages this many seconds
RATE_WINDOW_S = 60.0


#: Home Assistant reads the voice list once, when the integration is set up or reloaded
RELOAD_NOTE = ("A voice added while this runs appears in Home Assistant once you reload the "
               "integration (Devices & services > Wyoming Protocol > Reload).")


def wyoming_host_port(wyoming: str) -> tuple[str, str]:
    """The host and port Home Assistant connects to for a server at `wyoming`
    (tcp://HOST:PORT); a server on every address is reached at this computer's."""
    host, port = wyoming.removeprefix("tcp://").rsplit(":", 1)
    if host in ("0.0.0.0", "::"):
        try:
            host = announced_address(host)
        except InputError:
            host = "this computer's address"
    return host, port


def announced_text(address: str) -> str:
    """What the mDNS announcement at `address` means for Home Assistant: one on another
    machine cannot connect to a loopback address, so say what to change."""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return (f"Announced at {address}: only a Home Assistant on this computer can "
                f"connect. For one on another machine, set Listen on to '{HOSTS[1][0]}' "
                "and start again.")
    return f"Announced at {address}: Home Assistant on your network finds it."


def home_assistant_voices(folders: list[str]) -> list[str]:
    """What Home Assistant will list for these voice folders, in its order (the first is
    the voice a new assistant picks); none when a folder cannot be served as it is."""
    try:
        return [description for _, description in home_assistant_list(
            discover(folders, base=serving_base()).values())]
    except InputError:
        return []


def home_assistant_text(wyoming: str) -> str:
    """What to type into Home Assistant's Wyoming Protocol integration, for a server at
    `wyoming` (tcp://HOST:PORT); the voices it lists are beside it (`home_assistant_voices`)."""
    host, port = wyoming_host_port(wyoming)
    return (f"Home Assistant: Settings > Devices & services > Add integration > Wyoming "
            f"Protocol, host {host}, port {port}.")


def servable_voices(workspace: Path | None) -> list[tuple[str, Path]]:
    """The workspace's voices that can speak (name, folder): the server's own rule
    (`engine.serve.voices.servable`), so a voice Listen and Read speak is offered here."""
    if workspace is None:
        return []
    base = serving_base()
    return [(entry.path.name, entry.path) for entry in catalog.list_voices(workspace)
            if servable(entry.path, base)]


def curl_line(url: str, voice: str, key: str | None) -> str:
    auth = f" \\\n  -H 'Authorization: Bearer {key}'" if key else ""
    body = json.dumps({"model": "tts-1", "voice": voice, "input": "Hello from my own voice.",
                       "response_format": "wav"})
    return (f"curl -sS {url}/audio/speech{auth} \\\n  -H 'Content-Type: application/json' "
            f"\\\n  -d {shlex.quote(body)} -o hello.wav")


def python_snippet(url: str, voice: str, key: str | None) -> str:
    return (f"from openai import OpenAI\n\n"
            f"client = OpenAI(base_url={url!r}, api_key={key or 'no-key'!r})\n"
            f"with client.audio.speech.with_streaming_response.create(\n"
            f"        model=\"tts-1\", voice={voice!r}, input=\"Hello from my own voice.\",\n"
            f"        response_format=\"wav\") as response:\n"
            f"    response.stream_to_file(\"hello.wav\")\n")


#: joins a name's parts so a wrapped line never breaks inside it (after "/" or "-")
WORD_JOINER = "\u2060"


def unbroken(name: str) -> str:
    """`name` as a label shows it whole: no line break after its "/", "-", "_" or "."."""
    for mark in "/-_.":
        name = name.replace(mark, mark + WORD_JOINER)
    return name


def serving_text(voices: int, names: list[str]) -> str:
    """What runs, in one line that never breaks inside the address (the URL box below
    holds it) or inside a name ("ada/ada-" then "v1" once): the voices ticked, and the
    names clients can ask for (a voice, each of its exports and runs)."""
    shown = ", ".join(unbroken(n) for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"Serving {count(voices, 'voice')} at the URL below, as "
            f"{count(len(names), 'name')}: {shown}.")


#: the first line of the curl example while the server is stopped (one line for both
#: examples: the Python box has no room for another at 1100x760)
START_FIRST = "# Start the server first (Start, above); then run this, or the Python beside it:\n"


class ServePage(Page):
    title = "Serve"
    subtitle = ("Use your voices in other programs (chat apps, home automation, scripts) "
                "through OpenAI's speech endpoint.")
    icon_name = "serve"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.job: EngineJob | None = None
        self.key: str | None = None
        self._key_file: Path | None = None
        self.url = ""
        self._started_with = 0  # voices ticked at Start (the server names each several ways)
        self.served: deque[tuple[float, float]] = deque()  # (when, audio seconds)

        self._build_form()
        self._build_running()
        self._build_examples()
        self._rate_timer = QTimer(self)
        self._rate_timer.setInterval(1000)
        self._rate_timer.timeout.connect(self._show_rate)
        self._host_changed()
        self.zeroconf.setEnabled(False)

    def _build_form(self) -> None:
        """The voices to serve, where the server listens, and Home Assistant's service."""
        form = QGridLayout()
        form.addWidget(QLabel("Voices to serve"), 0, 0, Qt.AlignmentFlag.AlignTop)
        self.voices = QListWidget()
        # as tall as its voices up to three, then it scrolls: the Requests table below
        # needs the height (`_fit_voices`)
        self.voices.setToolTip("Each checked voice is served with its exports and trained runs.")
        form.addWidget(self.voices, 0, 1)
        form.addWidget(QLabel("Listen on"), 1, 0)
        self.host = QComboBox()
        for text, host in HOSTS:
            self.host.addItem(text, host)
        # the server's settings the form shows, each a field of the engine's ServeSettings
        self.fields = {"host": SettingField(ServeSettings, "host", widget=self.host),
                       "port": SettingField(ServeSettings, "port"),
                       "zeroconf": SettingField(ServeSettings, "zeroconf")}
        self.host.currentIndexChanged.connect(self._host_changed)
        self.port = self.fields["port"].widget
        self.port.valueChanged.connect(self._show_example)
        self.use_key = QCheckBox("Require a key")
        self.use_key.setToolTip("Clients must send 'Authorization: Bearer KEY' (always on when "
                                "other computers can connect).")
        self.use_key.toggled.connect(self._show_example)
        self.voices.itemChanged.connect(self._show_example)
        form.addWidget(hbox(self.host, QLabel("port"), self.port, self.use_key, stretch_at=4),
                       1, 1)
        # Home Assistant speaks Wyoming, not HTTP: the same server answers it too
        self.home_assistant = QCheckBox("Home Assistant")
        self.home_assistant.setToolTip(
            "Also serve the voices to Home Assistant (its Wyoming Protocol integration). "
            "Wyoming has no keys: with 'Other computers too', every device on the network "
            "can use them.")
        self.wyoming_port = QSpinBox()
        self.wyoming_port.setRange(0, 65535)
        self.wyoming_port.setValue(WYOMING_PORT)
        self.wyoming_port.setToolTip("TCP port of the Wyoming service; 0 picks a free one.")
        self.zeroconf = self.fields["zeroconf"].widget
        self.home_assistant.toggled.connect(self._home_assistant_changed)
        self.voices.itemChanged.connect(self._show_home_assistant_voices)
        form.addWidget(hbox(self.home_assistant, QLabel("port"), self.wyoming_port,
                            self.zeroconf, stretch_at=4), 2, 1)
        self.outer.addLayout(form)


    def _build_running(self) -> None:
        """Start / Stop, and what a running server tells a client: its address, key and
        Wyoming side."""
        self.start_button = button("Start", "play", primary=True, slot=self.start)
        self.stop_button = button("Stop", "stop", slot=self.stop)
        self.stop_button.setEnabled(False)
        self.state = QLabel("Stopped.")
        self.state.setWordWrap(True)
        self.outer.addWidget(hbox(self.start_button, self.stop_button, self.state, stretch_at=2))

        self.url_field = QLineEdit()
        self.url_field.setReadOnly(True)
        self.url_field.setPlaceholderText("The server's address appears here once it runs.")
        self.key_field = QLineEdit()
        self.key_field.setReadOnly(True)
        self.key_field.setPlaceholderText("No key.")
        self.rate = QLabel("")
        self.outer.addWidget(hbox(QLabel("URL"), self.url_field, QLabel("Key"), self.key_field,
                                  self.rate))
        self.wyoming_info = QLabel("")
        self.wyoming_info.setWordWrap(True)
        self.wyoming_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.outer.addWidget(self.wyoming_info)
        # Home Assistant's side: the address to type in, and the voices as it will list them
        self.wyoming_field = QLineEdit()
        self.wyoming_field.setReadOnly(True)
        self.wyoming_field.setPlaceholderText("The Wyoming address appears here once it runs.")
        self.copy_wyoming = button("Copy", tip="Copy the Wyoming address (host:port)",
                                   slot=self._copy_wyoming)
        self.copy_wyoming.setEnabled(False)
        self.ha_voices = QListWidget()
        self.ha_voices.setMaximumHeight(2 * self.ha_voices.fontMetrics().height() + 16)
        self.ha_voices.setToolTip("The voices Home Assistant will list, in its order: the "
                                  "first is the one a new assistant picks.")
        self.ha_note = QLabel(RELOAD_NOTE)
        self.ha_note.setWordWrap(True)
        # the note under the row at full width: beside the list it wrapped to seven lines,
        # which left the Requests table one row at 1100x760
        self.ha_panel = vbox(hbox(QLabel("Wyoming"), self.wyoming_field, self.copy_wyoming,
                                  QLabel("Home Assistant lists"), self.ha_voices),
                             self.ha_note)
        self.wyoming_field.setMaximumWidth(180)
        self.ha_panel.setVisible(False)
        self.outer.addWidget(self.ha_panel)

    def _build_examples(self) -> None:
        """How to call it (curl, Python) and the requests it answered."""
        self.curl = QPlainTextEdit()
        self.curl.setReadOnly(True)
        self.python = QPlainTextEdit()
        self.python.setReadOnly(True)
        # side by side: one above the other left the Requests table one row at 1100x760
        for box in (self.curl, self.python):
            box.setMaximumHeight(88)
            box.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.outer.addWidget(QLabel("<b>Try it</b> (curl, left; Python with the "
                                    "<code>openai</code> package, right)"))
        self.outer.addWidget(hbox(self.curl, self.python))

        self.log = QTableWidget(0, 6)
        self.log.setHorizontalHeaderLabels(["Time", "Status", "Voice", "Format", "Audio s",
                                            "Took s"])
        self.log.verticalHeader().hide()
        self.log.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.log.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.outer.addWidget(QLabel("<b>Requests</b>"))
        self.outer.addWidget(self.log, 1)

    # -- form ------------------------------------------------------------------------------
    def refresh(self) -> None:
        # a voice the user unchecked stays unchecked; new voices come checked
        unchecked = {self.voices.item(i).data(Qt.ItemDataRole.UserRole)
                     for i in range(self.voices.count())
                     if self.voices.item(i).checkState() != Qt.CheckState.Checked}
        self.voices.clear()
        for name, path in servable_voices(self.ctx.workspace):
            item = QListWidgetItem(name)
            item.setData(Qt.ItemDataRole.UserRole, str(path))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked if str(path) in unchecked
                               else Qt.CheckState.Checked)
            self.voices.addItem(item)
        self._fit_voices()
        if not self.voices.count() and not self.running:
            self.state.setText("No voice has an export or a trained run yet: train one first.")
        self._show_example()

    def _fit_voices(self) -> None:
        rows = min(max(self.voices.count(), 1), 3)
        row = self.voices.sizeHintForRow(0) if self.voices.count() else \
            self.voices.fontMetrics().height() + 4
        self.voices.setFixedHeight(rows * row + 2 * self.voices.frameWidth() + 4)

    def _host_changed(self) -> None:
        remote = self.host.currentData() != "127.0.0.1"
        if remote:
            self.use_key.setChecked(True)
        self.use_key.setEnabled(not remote)
        self._show_example()

    def _show_example(self) -> None:
        """While stopped, the examples with the address, voice and key the form would
        start (empty boxes said nothing); the running server's own ones replace them."""
        if self.running:
            return
        url = url_of(str(self.host.currentData()), self.port.value())
        if not self.port.value():  # port 0: the server picks one when it starts
            url = url.replace(":0/", ":PORT/")
        names = [Path(p).name for p in self.chosen()]
        voice = min(names) if names else "VOICE"  # the server's first voice, by name
        key = "KEY" if self.use_key.isChecked() else None  # a new one at each start
        self.curl.setPlainText(START_FIRST + curl_line(url, voice, key))
        self.python.setPlainText(python_snippet(url, voice, key))

    def chosen(self) -> list[str]:
        return [str(self.voices.item(i).data(Qt.ItemDataRole.UserRole))
                for i in range(self.voices.count())
                if self.voices.item(i).checkState() == Qt.CheckState.Checked]

    @property
    def running(self) -> bool:
        return self.job is not None and self.job.outcome is None

    # -- server ----------------------------------------------------------------------------
    def start(self) -> None:
        voices = self.chosen()
        if not voices or self.running:
            if not voices:
                self.state.setText("Check at least one voice to serve.")
            return
        self.key = None
        if self.use_key.isChecked():
            self.key = secrets.token_urlsafe(32)
            fd, name = tempfile.mkstemp(prefix="voxshard-key-")  # owner-only: 0600
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.key + "\n")
            self._key_file = Path(name)
        args = self.serve_args(str(self._key_file) if self.key else None)
        self.log.setRowCount(0)
        self.served.clear()
        self._started_with = len(voices)
        self.job = self.start_job(args, "Serve")
        self.job.event.connect(self._on_event)
        self.job.finished.connect(self._on_finished)
        self.state.setText("Starting: loading the first voice...")
        self.start_button.setEnabled(False)
        self.stop_button.setEnabled(True)

    def serve_args(self, key_file: str | None) -> list[str]:
        """The `serve` command line of the form's choice: each setting by the CLI's own
        flag for it (`engine.config.serve.SERVE_SETTINGS`)."""
        f = self.fields
        args = ["serve", *self.chosen(), *f["host"].args(always=True),
                *f["port"].args(always=True)]
        if key_file:
            args += [flag_of(ServeSettings, "api_key_file"), key_file]
        if self.home_assistant.isChecked():
            host = str(f["host"].value())
            args += [flag_of(ServeSettings, "wyoming"),
                     f"tcp://{host}:{self.wyoming_port.value()}"]
            if host != ServeSettings.host:  # the user chose other computers: say so
                args.append(flag_of(ServeSettings, "wyoming_allow_lan"))
            args += f["zeroconf"].args()
        return args

    def stop(self) -> None:
        if self.running and self.job is not None:
            self.state.setText("Stopping...")
            self.job.cancel()

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "state" and event.get("state") == "serving":
            self.url = str(event.get("url") or "")
            self.url_field.setText(self.url)
            voice = (event.get("voices") or ["VOICE"])[0]
            self.curl.setPlainText(curl_line(self.url, voice, self.key))
            self.python.setPlainText(python_snippet(self.url, voice, self.key))
            if self.key:
                self.key_field.setText(self.key)
                QGuiApplication.clipboard().setText(self.key)
                note = " The key was copied to the clipboard; it is shown only while this runs."
            else:
                note = ""
            self.state.setText(serving_text(self._started_with,
                                            [str(v) for v in event.get("voices") or []]) + note)
            self._rate_timer.start()
            # Listen speaks the sources served here through this server: one warm worker
            loads = {str(k): str(v) for k, v in (event.get("loads") or {}).items()}
            self.ctx.speech.set_endpoint(ServedEndpoint(self.url, self.key, loads))
            if event.get("wyoming"):
                self.wyoming_info.setText(home_assistant_text(str(event["wyoming"])))
                if event.get("zeroconf"):
                    self.ha_note.setText(f"{announced_text(str(event['zeroconf']))} "
                                         f"{RELOAD_NOTE}")
                self.wyoming_field.setText(":".join(wyoming_host_port(str(event["wyoming"]))))
                self.copy_wyoming.setEnabled(True)
                # the server's own list, as it serves it (a voice added later: RELOAD_NOTE)
                self._list_home_assistant_voices(
                    [str(d) for _, d in event.get("wyoming_voices") or []])
        elif "request_log" in event:
            self._add_request(event["request_log"])

    def _copy_wyoming(self) -> None:
        QGuiApplication.clipboard().setText(self.wyoming_field.text())
        self.state.setText(f"Copied {self.wyoming_field.text()}: in Home Assistant, Add "
                           "integration > Wyoming Protocol, host and port from it.")

    def _home_assistant_changed(self, on: bool) -> None:
        self.zeroconf.setEnabled(on)
        self.ha_panel.setVisible(on)
        self._show_home_assistant_voices()

    def _show_home_assistant_voices(self) -> None:
        """While stopped, the list the ticked voices would make (a running server's own
        list stays until it stops)."""
        if not self.running and self.home_assistant.isChecked():
            self._list_home_assistant_voices(home_assistant_voices(self.chosen()))

    def _list_home_assistant_voices(self, descriptions: list[str]) -> None:
        self.ha_voices.clear()
        self.ha_voices.addItems(descriptions)

    def _add_request(self, record: dict[str, Any]) -> None:
        if self.log.rowCount() >= LOG_ROWS:
            self.log.removeRow(0)
        row = self.log.rowCount()
        self.log.insertRow(row)
        # a refusal's code beside its status: what its client was told
        status = f"{record.get('status', '')} {record.get('error') or ''}".strip()
        cells = [time.strftime("%H:%M:%S"), status,
                 str(record.get("voice", "")),
                 f"{record.get('format', '')} {record.get('stream', '')}".strip(),
                 f"{float(record.get('audio_s') or 0):.2f}",
                 f"{float(record.get('seconds') or 0):.2f}"]
        for col, text in enumerate(cells):
            self.log.setItem(row, col, QTableWidgetItem(text))
        self.log.scrollToBottom()
        if record.get("status") == 200:
            self.served.append((time.monotonic(), float(record.get("audio_s") or 0)))
        self._show_rate()

    def _show_rate(self) -> None:
        now = time.monotonic()
        while self.served and now - self.served[0][0] > RATE_WINDOW_S:
            self.served.popleft()
        audio = sum(s for _, s in self.served)
        self.rate.setText(f"{audio / RATE_WINDOW_S:.2f} audio s per s (last minute)")

    def _on_finished(self) -> None:
        self._rate_timer.stop()
        self.ctx.speech.set_endpoint(None)
        if self._key_file is not None:
            self._key_file.unlink(missing_ok=True)
            self._key_file = None
        self.key = None
        self.key_field.clear()  # shown once: a new start makes a new key
        self.url_field.clear()
        self.wyoming_info.clear()
        self.wyoming_field.clear()
        self.copy_wyoming.setEnabled(False)
        self.ha_note.setText(RELOAD_NOTE)
        self._show_home_assistant_voices()
        self.start_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        outcome = self.job.outcome if self.job is not None else None
        if outcome == "failed":
            self.state.setText("The server stopped with an error (see the message).")
        else:
            self.state.setText("Stopped.")
        self._show_example()
