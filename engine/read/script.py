"""A script as chapters of lines: plain text, Markdown, dialogue, or an EPUB's chapters.

- Plain text: paragraphs (blank-line separated) are lines, all in one chapter.
- Markdown: each heading starts a chapter named by it; emphasis and link marks are
  dropped, the words kept.
- Dialogue (in either): a paragraph line `Name: words` is a line of the voice `Name` when
  `Name` is a speaker the read knows (its cast, its workspace's voices: `ScriptNames`);
  any other `Words: text` (`Note: ...`, a list item) is text, said by the narrator.
- Inline, anywhere in a line: `[style]` sets the style of the words after it (the synth's
  instruction) when it is a style the read knows (declared, or trained into a voice);
  a pause in any common spelling (`[pause]`, `[pause 1.5s]`, `[pause 2 seconds]`,
  `[500 ms pause]`, `[silence: 2s]`, `[beat]`) is a pause there; either cuts the line
  there. Any other bracket (`[sic]`) is text; a Markdown footnote mark (`[^1]`) and its
  definition are not read. A bracket that looks like a pause whose length cannot be read
  is refused, with its line.
- EPUB: the spine's linear documents in order (not its table of contents), each heading a
  chapter, each paragraph a line.
"""

from __future__ import annotations

import dataclasses
import html.parser
import posixpath
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from engine.core.errors import InputError

#: a pause with no length given, seconds
DEFAULT_PAUSE_S = 1.0
#: the longest pause a script may ask for, seconds
MAX_PAUSE_S = 30.0

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SPEAKER = re.compile(r"^([A-Za-z][\w .'/-]{0,40}?):\s+(.+)$")
_TAG = re.compile(r"\[([^\[\]]{1,80})\](?!\()")
_PAUSE_WORD = r"(?:pause|silence|break|beat)"
_UNIT = (r"(?:ms|msecs?|milliseconds?|s|secs?|seconds?|mins?|minutes?)")
_NUMBER = r"\d+(?:\.\d+)?"
_PAUSE = re.compile(
    rf"^(?:{_PAUSE_WORD}(?:\s*[:=]?\s*(?P<n1>{_NUMBER})\s*(?P<u1>{_UNIT})?)?"
    rf"|(?P<n2>{_NUMBER})\s*-?\s*(?P<u2>{_UNIT})\s+(?:of\s+)?{_PAUSE_WORD})$", re.IGNORECASE)
#: a bracket that names a pause without a length `_PAUSE` reads
_PAUSE_LIKE = re.compile(rf"^{_PAUSE_WORD}\b|\b{_PAUSE_WORD}$", re.IGNORECASE)
#: a Markdown footnote's definition line, `[^1]: words`
_FOOTNOTE = re.compile(r"^\[\^[^\]]+\]:")
_LINK = re.compile(r"\[([^\[\]]*)\]\([^)]*\)")
_EMPHASIS = re.compile(r"(\*{1,3}|_{1,3}|`+|~~)(?=\S)(.+?)(?<=\S)\1")


@dataclass(frozen=True)
class ScriptNames:
    """Who and what a script's marks may name, any case: the speakers a `Name: words` line
    may start with (the cast's and the workspace's voices) and the styles a `[style]` may
    set (declared ones, and those trained into a voice)."""

    speakers: frozenset[str] = frozenset()
    styles: frozenset[str] = frozenset()

    @staticmethod
    def of(speakers: Iterable[str], styles: Iterable[str]) -> ScriptNames:
        return ScriptNames(frozenset(s.strip().lower() for s in speakers),
                           frozenset(s.strip().lower() for s in styles))

    def is_speaker(self, name: str) -> bool:
        return name.strip().lower() in self.speakers

    def bracket(self, tag: str, where: str) -> tuple[str, float | str | None]:
        """What `[tag]` is: ("pause", seconds), ("style", its words), ("note", None) for a
        footnote mark, or ("text", None); a pause whose length cannot be read is refused."""
        tag = tag.strip()
        pause = _PAUSE.match(tag)
        if pause:
            return "pause", _pause_seconds(pause, where)
        if _PAUSE_LIKE.search(tag):
            raise InputError(f"{where}: [{tag}] looks like a pause, but its length cannot "
                             "be read.", "Write it as [pause], [pause 2s] or [pause 500 ms], "
                             "or without brackets if it is words to say.")
        if tag.lower() in self.styles:
            return "style", tag
        if tag.startswith("^"):
            return "note", None
        return "text", None


@dataclass(frozen=True)
class Line:
    """One line of the script: who says it, how, and the pause after it."""

    #: 1-based, in script order
    number: int
    chapter: int
    text: str
    #: the script's name for the speaker ("" for the narrator)
    speaker: str = ""
    style: str | None = None
    #: an explicit pause after it ([pause]); None: the project's line/paragraph pause
    pause_s: float | None = None
    #: the last line of its paragraph (takes the paragraph pause)
    paragraph_end: bool = False
    #: its chapter's title, said before the chapter's first line (`Script.with_titles`)
    title: bool = False


@dataclass
class Chapter:
    title: str
    lines: list[Line] = field(default_factory=list)
    #: its title is the script's (a heading), not one made up for it ("Chapter 1")
    named: bool = True


@dataclass
class Script:
    chapters: list[Chapter]
    #: the book's title and author, and its cover image (file name, bytes), where its
    #: file says (an EPUB's package metadata)
    title: str = ""
    author: str = ""
    cover: tuple[str, bytes] | None = None

    @property
    def lines(self) -> list[Line]:
        return [line for chapter in self.chapters for line in chapter.lines]

    @property
    def speakers(self) -> list[str]:
        return list(dict.fromkeys(line.speaker for line in self.lines))

    def with_titles(self, pause_s: float) -> Script:
        """The script with each named chapter opening on its title, a line of its own said
        by the narrator with `pause_s` after it (lines renumbered in order)."""
        chapters, count = [], 0
        for index, chapter in enumerate(self.chapters):
            lines = ([Line(0, index, chapter.title, pause_s=pause_s, paragraph_end=True,
                           title=True)] if chapter.named and chapter.title.strip() else [])
            numbered = []
            for line in [*lines, *chapter.lines]:
                count += 1
                numbered.append(dataclasses.replace(line, number=count))
            chapters.append(Chapter(chapter.title, numbered, chapter.named))
        return Script(chapters, self.title, self.author, self.cover)


def _plain_markdown(text: str) -> str:
    text = _LINK.sub(r"\1", text)
    for _ in range(2):  # nested emphasis (***word*** inside **...**)
        text = _EMPHASIS.sub(r"\2", text)
    return text


def _pause_seconds(match: re.Match[str], where: str) -> float:
    number = match.group("n1") or match.group("n2")
    unit = (match.group("u1") or match.group("u2") or "s").lower()
    scale = 0.001 if unit.startswith("m") and not unit.startswith("min") \
        else 60.0 if unit.startswith("min") else 1.0
    seconds = DEFAULT_PAUSE_S if number is None else float(number) * scale
    if seconds > MAX_PAUSE_S:
        raise InputError(f"The pause of {seconds:g} s in {where} is longer than "
                         f"{MAX_PAUSE_S:g} s.", "Use a shorter [pause N s].")
    return seconds


class _Builder:
    """Collects lines into chapters, cutting each at its pauses and styles."""

    def __init__(self, names: ScriptNames) -> None:
        self.names = names
        self.chapters: list[Chapter] = []
        self.count = 0

    def chapter(self, title: str) -> None:
        self.chapters.append(Chapter(title.strip() or f"Chapter {len(self.chapters) + 1}",
                                     named=bool(title.strip())))

    def paragraph(self, speaker: str, text: str, where: str) -> None:
        """One paragraph line of the script (its pauses and styles cut it into lines)."""
        if not self.chapters:
            self.chapter("")
        pieces: list[tuple[str, str | None, float | None]] = []  # text, style, pause after
        style: str | None = None
        words: list[str] = []
        position = 0

        def cut() -> None:
            said = " ".join("".join(words).split())
            words.clear()
            if said:
                pieces.append((said, style, None))

        for match in _TAG.finditer(text):
            words.append(text[position:match.start()])
            position = match.end()
            kind, value = self.names.bracket(match.group(1), where)
            if kind == "text":
                words.append(match.group(0))
                continue
            if kind == "note":  # a footnote mark is not said
                continue
            cut()
            if kind == "style":
                style = str(value)
            elif pieces:
                last = pieces[-1]
                pieces[-1] = (last[0], last[1], (last[2] or 0.0) + float(value or 0.0))
            else:  # a pause before any words: after the previous line
                self._pause_before(float(value or 0.0))
        words.append(text[position:])
        cut()
        for said, piece_style, pause in pieces:
            self.count += 1
            self.chapters[-1].lines.append(Line(self.count, len(self.chapters) - 1, said,
                                                speaker, piece_style, pause))

    def _pause_before(self, seconds: float) -> None:
        lines = self.chapters[-1].lines
        if lines:
            last = lines[-1]
            lines[-1] = Line(last.number, last.chapter, last.text, last.speaker, last.style,
                             (last.pause_s or 0.0) + seconds, last.paragraph_end)

    def end_paragraph(self) -> None:
        if self.chapters and self.chapters[-1].lines:
            last = self.chapters[-1].lines[-1]
            if not last.paragraph_end:
                self.chapters[-1].lines[-1] = Line(last.number, last.chapter, last.text,
                                                   last.speaker, last.style, last.pause_s, True)

    def script(self, name: str) -> Script:
        chapters = [c for c in self.chapters if c.lines]
        if not chapters:
            raise InputError(f"The script {name} has no words to read.",
                             "Write some text in it (Markdown headings make chapters).")
        # chapters renumbered without the empty ones (a title page heading)
        out = []
        for index, chapter in enumerate(chapters):
            out.append(Chapter(chapter.title, [Line(ln.number, index, ln.text, ln.speaker,
                                                    ln.style, ln.pause_s, ln.paragraph_end)
                                               for ln in chapter.lines], chapter.named))
        return Script(out)


def parse_text(text: str, name: str = "the script", markdown: bool = True,
               names: ScriptNames | None = None) -> Script:
    """Chapters and lines of a plain-text or Markdown script (see the module doc); `names`:
    the speakers and styles it may name (none: every line is the narrator's, plain)."""
    builder = _Builder(names or ScriptNames())
    pending: list[str] = []  # the paragraph's source lines (wrapped text is one paragraph)
    where = name

    def flush() -> None:
        if pending:
            builder.paragraph("", " ".join(pending), where)
            pending.clear()
        builder.end_paragraph()

    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped:
            flush()
            continue
        heading = _HEADING.match(stripped) if markdown else None
        if heading:
            flush()
            builder.chapter(_plain_markdown(heading.group(2)))
            continue
        if markdown and _FOOTNOTE.match(stripped):
            flush()  # a footnote's definition is not read where it is written
            continue
        if markdown:
            stripped = _plain_markdown(re.sub(r"^(?:[-*+]\s+|>\s*|\d+[.)]\s+)", "", stripped))
        spoken = _SPEAKER.match(stripped)
        if spoken and builder.names.is_speaker(spoken.group(1)):
            # a speaker's line is a paragraph of its own
            flush()
            builder.paragraph(spoken.group(1).strip(), spoken.group(2), f"{name} line {number}")
            builder.end_paragraph()
            continue
        if not pending:
            where = f"{name} line {number}"
        pending.append(stripped)
    flush()
    return builder.script(name)


class _EpubText(html.parser.HTMLParser):
    """Headings and paragraphs of one XHTML document, in order."""

    _BLOCKS = frozenset({"p", "div", "li", "blockquote"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []  # ("h" or "p", text)
        self._kind: str | None = None
        self._text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "head"):
            self._skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self._kind = "h"
        elif tag in self._BLOCKS:
            self._flush()
            self._kind = "p"
        elif tag == "br":
            self._text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head"):
            self._skip = max(0, self._skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) or tag in self._BLOCKS:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._text.append(data)

    def _flush(self) -> None:
        text = " ".join("".join(self._text).split())
        if text:
            self.blocks.append((self._kind or "p", text))
        self._text = []
        self._kind = None

    def close(self) -> None:
        super().close()
        self._flush()


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def epub_reading_order(opf: str, opf_path: str) -> list[str]:
    """The spine's documents that are read, in order: its linear content, never its
    navigation (the EPUB 3 `nav` document, which ebooklib puts in the spine, or the NCX)
    and never what the spine marks `linear="no"` (notes, pop-ups)."""
    try:
        package = ElementTree.fromstring(opf)
    except ElementTree.ParseError as exc:
        raise InputError(f"The EPUB's package file {opf_path} is not XML ({exc}).",
                         "Is it a valid EPUB?") from exc
    items: dict[str, str] = {}
    for item in package.iter():
        if _local(item.tag) != "item" or not item.get("id") or not item.get("href"):
            continue
        navigation = "nav" in (item.get("properties") or "").split() \
            or item.get("media-type") == "application/x-dtbncx+xml"
        if not navigation:
            items[str(item.get("id"))] = str(item.get("href"))
    root = posixpath.dirname(opf_path)
    return [posixpath.normpath(posixpath.join(root, items[ref.get("idref", "")]))
            for ref in package.iter() if _local(ref.tag) == "itemref"
            and ref.get("idref") in items and (ref.get("linear") or "yes").lower() != "no"]


def epub_metadata(book: zipfile.ZipFile, opf_path: str) -> tuple[str, str,
                                                                  tuple[str, bytes] | None]:
    """The EPUB's title, first author and cover image (EPUB 3 `cover-image`, or EPUB 2's
    `<meta name="cover">`), each empty where the package names none."""
    try:
        package = ElementTree.fromstring(book.read(opf_path))
    except ElementTree.ParseError:
        return "", "", None
    found = {"title": "", "creator": ""}
    cover_id, items, cover = "", {}, None
    for node in package.iter():
        tag = _local(node.tag)
        if tag in found and not found[tag]:
            found[tag] = " ".join((node.text or "").split())
        elif tag == "meta" and node.get("name") == "cover":
            cover_id = node.get("content") or ""
        elif tag == "item" and node.get("href"):
            items[node.get("id") or ""] = str(node.get("href"))
            if "cover-image" in (node.get("properties") or "").split():
                cover = str(node.get("href"))
    href = cover or items.get(cover_id)
    image = None
    if href:
        name = posixpath.normpath(posixpath.join(posixpath.dirname(opf_path), href))
        try:
            image = (name, book.read(name))
        except KeyError:
            image = None
    return found["title"], found["creator"], image


def _epub_documents(book: zipfile.ZipFile) -> list[str]:
    """The spine's documents in reading order (META-INF/container.xml -> the OPF)."""
    container = book.read("META-INF/container.xml").decode("utf-8", "replace")
    found = re.search(r'full-path="([^"]+)"', container)
    if not found:
        raise InputError("The EPUB names no package file.", "Is it a valid EPUB?")
    opf_path = found.group(1)
    return epub_reading_order(book.read(opf_path).decode("utf-8", "replace"), opf_path)


def parse_epub(path: Path, names: ScriptNames | None = None) -> Script:
    try:
        with zipfile.ZipFile(path) as book:
            documents = [(doc, book.read(doc).decode("utf-8", "replace"))
                         for doc in _epub_documents(book)]
            found = re.search(r'full-path="([^"]+)"',
                              book.read("META-INF/container.xml").decode("utf-8", "replace"))
            title, author, cover = (epub_metadata(book, found.group(1)) if found
                                    else ("", "", None))
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise InputError(f"Cannot read the EPUB {path.name}: {exc}.",
                         "Is it a valid EPUB (a zip with META-INF/container.xml)?") from exc
    builder = _Builder(names or ScriptNames())
    for doc, xhtml in documents:
        parser = _EpubText()
        parser.feed(xhtml)
        parser.close()
        for kind, text in parser.blocks:
            if kind == "h":
                builder.chapter(text)
            else:
                builder.paragraph("", text, f"{path.name}:{doc}")
                builder.end_paragraph()
    script = builder.script(path.name)
    script.title, script.author, script.cover = title, author, cover
    return script


def read_script(path: str | Path, names: ScriptNames | None = None) -> Script:
    """The script in `path`: .epub, .md/.markdown (headings are chapters) or plain text;
    `names`: the speakers and styles its marks may name."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"The script {path} does not exist.", "Give a .txt, .md or .epub file.")
    if path.suffix.lower() == ".epub":
        return parse_epub(path, names)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"The script {path.name} is not UTF-8 text.",
                         "Save it as UTF-8 and try again.") from exc
    markdown = path.suffix.lower() in (".md", ".markdown")
    return parse_text(text, path.name, markdown=markdown, names=names)
