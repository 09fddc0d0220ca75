"""What a read project asks: its script, voices, pauses and export (no torch: the window
builds these)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from engine.config.schema import SettingError, check, section, setting
from engine.core.errors import InputError

#: what `read -o` writes, by extension
READ_FORMATS = ("wav", "flac", "mp3", "m4b")
#: loudness targets people ask for: a podcast, an audiobook (ACX asks -18 to -23 LUFS)
LOUDNESS_PRESETS = {"podcast": -16.0, "audiobook": -18.0, "quiet audiobook": -20.0}
#: export presets: what each sets, within the ranges its platform accepts (ACX: RMS -23 to
#: -18 dB, sample peak at most -3 dBFS, noise floor at most -60 dB, a 0.5-1 s head and a
#: 1-5 s tail per chapter); an export with a preset carries that platform's check, per
#: chapter, measured on the written file
EXPORT_PRESETS: dict[str, dict[str, float]] = {
    "acx": {"rms_db": -20.5, "peak_dbfs": -3.5, "room_tone_db": -65.0}}


#: a line or a part of it: `12` or `12.2` (parts from 1)
_PART = re.compile(r"^([1-9]\d*)(?:\.([1-9]\d*))?$")


def line_part(item: str | int) -> tuple[int, int | None]:
    """(line number, 0-based part or None for the whole line) of `N` or `N.K`."""
    found = _PART.match(str(item).strip())
    if found is None:
        raise InputError(f"{item!r} is not LINE or LINE.PART.",
                         "Write it as 12, or 12.2 for the second part of line 12.")
    return int(found[1]), (int(found[2]) - 1 if found[2] else None)


def _check(cond: bool, message: str, hint: str | None = None) -> None:
    if not cond:
        raise InputError(message, hint)


@section("read")
@dataclass(frozen=True)
class ReadRequest:
    """One `read`: render what is missing of a script's lines, then export (when `out`)."""

    script: str
    #: the audio to write: .wav, .flac, .mp3 or .m4b (chapters in MP3 and M4B); none:
    #: render the takes only
    out: str | None = None
    #: the project folder keeping every take (default: beside the script, NAME.read)
    project: str | None = None
    #: the workspace whose voices the script names (serve's names: ada, ada/instant, ...)
    workspace: str | None = setting(None, label="Workspace")
    #: styles a script's [style] may set beyond those trained into its voices (any other
    #: bracket is words to say)
    styles: tuple[str, ...] = setting((), label="Styles")
    #: the voice of lines that name none (the narrator)
    voice: str | None = setting(None, label="Narrator")
    #: a script speaker's voice, as NAME=VOICE (a speaker that is a voice's name needs none)
    cast: tuple[str, ...] = setting((), label="Cast")
    #: "auto" or one of the model's languages
    language: str = "auto"
    #: the seed of every line's first take (a retry or a new take takes the next unused)
    seed: int = 1
    #: soft limit of characters per chunk; short chunks keep a long read from drifting
    chunk_chars: int = setting(160, label="Chunk", unit="chars", at_least=20,
                               at_most=400)
    #: hard cap on codec frames per chunk (12.5 per second); none: from the text's length
    max_frames: int | None = setting(None, label="Frame cap", at_least=2, at_most=8192)
    #: renders tried again with another seed when one loops, stays silent, hits its cap
    #: or says the wrong words
    retries: int = setting(2, label="Retries", at_least=0, at_most=10)
    #: transcribe each take and flag (and retry) one whose words are not its line's
    word_check: bool = setting(True, label="Check words")
    #: the word error rate above which a take says the wrong words (the offline
    #: recogniser hears about 0.3 on a right line and 0.85 or more on a wrong one; with
    #: a Whisper model, 0.3 catches a skipped clause)
    wer_max: float = setting(0.7, label="Max WER", at_least=0.05, at_most=2)
    #: the recogniser of the word check: auto (a cached Whisper model, else the offline
    #: pocketsphinx), pocketsphinx, or a Whisper folder or hub id
    asr: str = "auto"
    #: silence after a line, seconds
    line_pause_s: float = 0.4
    #: silence after a paragraph's last line, seconds
    paragraph_pause_s: float = 0.9
    #: silence after each chapter's last line (its tail, the book's last one too), seconds
    chapter_pause_s: float = 2.0
    #: room tone before each chapter's first line, seconds
    head_s: float = 0.75
    #: say each chapter's title (a heading) as a line of its own before the chapter;
    #: none: for an EPUB only
    chapter_titles: bool | None = None
    #: silence after a spoken chapter title, seconds
    title_pause_s: float = 1.5
    #: integrated loudness of the export in LUFS (-16 podcast, -18/-20 audiobook)
    loudness_lufs: float | None = -18.0
    #: level the export by its RMS (dB) instead of its loudness (ACX measures RMS)
    rms_db: float | None = setting(None, label="RMS level", unit="dB", at_least=-40,
                                   below=0)
    #: the sample peak (dBFS) a limiter holds the export under, instead of lowering it all
    peak_dbfs: float = -1.0
    #: the level (dBFS RMS) of the quiet noise in pauses, heads and tails, so they sound
    #: like a room rather than digital zero; none: digital silence
    room_tone_db: float | None = -65.0
    #: an export preset: its levels, head and tail, and its check per chapter on the file
    preset: str | None = setting(None, choices=("acx",))
    #: write NAME.srt and NAME.vtt of the lines' times beside the export
    subtitles: bool = True
    #: also write one track per voice, aligned, into NAME-tracks/ (for an audio editor)
    tracks: bool = False
    #: the export's title tag (default: the EPUB's title, else the script's name)
    title: str | None = None
    #: the export's author tag (default: the EPUB's author)
    author: str | None = None
    #: a JPEG or PNG the MP3 or M4B carries as its cover (default: the EPUB's cover)
    cover: str | None = None
    #: rows decoded together (lines and voices share them)
    rows: int = 8
    #: what to render a new take of, with a seed not used yet: LINE (each of its parts)
    #: or LINE.PART (one part, from 1)
    regenerate: tuple[int | str, ...] = ()
    #: make a take the chosen one, as LINE=SEED (a line said in one take) or
    #: LINE.PART=SEED
    pick: tuple[str, ...] = ()
    #: keep the takes of lines whose voice now speaks with another model (trained since,
    #: say) instead of rendering them again with it
    keep_other_models: bool = False
    device: str | None = None
    dtype: str = "auto"

    def __post_init__(self) -> None:
        _check(bool(self.script), "No script was given.", "Give a .txt, .md or .epub file.")
        try:
            check(self)  # the bounds of the fields declared with a `setting`
        except SettingError as exc:  # the setting as data: each surface names it its way
            raise exc.as_input() from exc
        _check(0 <= self.seed < 2**31, "seed must be between 0 and 2^31.")
        for name in ("line_pause_s", "paragraph_pause_s", "chapter_pause_s", "head_s",
                     "title_pause_s"):
            v = getattr(self, name)
            _check(0 <= v <= 30, f"{name} must be between 0 and 30 seconds (got {v}).")
        _check(self.loudness_lufs is None or -40 <= self.loudness_lufs < 0,
               f"The loudness target must be between -40 and 0 LUFS (got {self.loudness_lufs}).",
               "-16 for a podcast, -18 or -20 for an audiobook.")
        _check(-20 <= self.peak_dbfs <= 0,
               f"peak_dbfs must be between -20 and 0 dBFS (got {self.peak_dbfs}).")
        _check(self.room_tone_db is None or -96 <= self.room_tone_db <= -50,
               f"room_tone_db must be between -96 and -50 dBFS (got {self.room_tone_db}).")
        _check(self.preset is None or self.preset in EXPORT_PRESETS,
               f"There is no export preset {self.preset!r}.",
               f"Presets: {', '.join(EXPORT_PRESETS)}.")
        _check(1 <= self.rows <= 64, f"rows must be between 1 and 64 (got {self.rows}).")
        for item in self.cast:
            _check("=" in item and all(p.strip() for p in item.split("=", 1)),
                   f"The cast {item!r} is not NAME=VOICE.", "Write it as Ada=ada/instant.")
        for item in self.pick:
            line, _, seed = item.partition("=")
            _check(_PART.match(line.strip()) is not None and seed.strip().isdigit(),
                   f"The pick {item!r} is not LINE=SEED or LINE.PART=SEED.",
                   "Write it as 12=3, or 12.2=3 for the second part of line 12.")
        for item in self.regenerate:
            _check(_PART.match(str(item).strip()) is not None,
                   f"The new take {item!r} is not LINE or LINE.PART.",
                   "Write it as 12, or 12.2 for the second part of line 12.")
        if self.out:
            suffix = self.out.rsplit(".", 1)[-1].lower() if "." in self.out else ""
            _check(suffix in READ_FORMATS, f"The export {self.out} does not end in "
                   f"{', '.join('.' + f for f in READ_FORMATS)}.",
                   "Name it book.m4b, book.mp3, book.flac or book.wav.")

    @property
    def export_format(self) -> str | None:
        return self.out.rsplit(".", 1)[-1].lower() if self.out else None

    def for_export(self) -> ReadRequest:
        """The request with its preset's settings applied (its own when it has none): a
        preset fills the settings the request leaves at their defaults; one it gives
        (`--peak-dbfs -4` with `--preset acx`) is kept, and the preset's check says
        whether the file still passes."""
        if not self.preset:
            return self
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return self.replace(**{name: value for name, value in EXPORT_PRESETS[self.preset].items()
                               if getattr(self, name) == defaults[name]})

    def casting(self) -> dict[str, str]:
        """Speaker name (as the script writes it, any case) -> voice name."""
        return {k.strip().lower(): v.strip() for k, v in (c.split("=", 1) for c in self.cast)}

    def replace(self, **changes: Any) -> ReadRequest:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadRequest:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()
                  if k in known}
        return cls(**values)
