"""The one normal form of text: every module that reads, stores, speaks or compares
text goes through these functions, so each rule is written once.

- `tidy_text`: how a transcript is stored (take text, imported transcripts,
  recogniser output, prompts): NFC, invisible format characters dropped,
  whitespace and control characters one space. It never refuses and keeps the
  person's quotes and dashes, so the text shown is the text they wrote.
- `clean_text`: what the model is given: typographic variants mapped to what
  its tokenizer saw most, paragraph breaks kept, and what cannot be spoken
  refused with a message. `training_text` is the same form for a stored
  transcript (one line; a refused one stays as it was).
- `split_sentences`, `split_text`: sentences, and the chunks of a few
  sentences that one generation call speaks. Qwen3-TTS drifts (or forgets to
  stop) on very long inputs, so long text is cut at sentence boundaries.
- `wer_words`, `comparison_key`: the words as a listener compares them (case,
  accents and punctuation aside, numbers spelled out): word error rates count
  these, and two clips read the same sentence when their keys are equal.

Pure Python, no torch, so the GUI can validate and preview without a model.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from engine.core.errors import InputError

#: Soft limit on characters per chunk: a few sentences, well inside what the
#: model was trained on (clips of a few to ~20 seconds).
DEFAULT_CHUNK_CHARS = 220
#: Hard limit: about 25 s of speech. Longer chunks leave what the model was
#: trained on, and every text position must fit the worker's trailing-text
#: buffer and the chunk's frame cap to be spoken to its end-of-text.
MAX_CHUNK_CHARS = 400

# --- primitives ---------------------------------------------------------------------------

_APOSTROPHES = "\u2018\u2019\u201a\u201b"

# Typographic variants mapped to what the text tokenizer saw most in training.
_REPLACE = {
    **dict.fromkeys(_APOSTROPHES, "'"),
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": "-", "\u2014": " - ", "\u2212": "-", "\u2026": "...",
    "\u00a0": " ", "\u2009": " ", "\u202f": " ",
}


def _visible(text: str) -> str:
    """NFC with the invisible format characters (Unicode category Cf: soft hyphens,
    zero-width spaces and joiners, byte-order and direction marks) dropped.

    Dropped, not made spaces: a soft hyphen or a zero-width joiner sits inside a
    word, and splitting the word there would change what is said.
    """
    text = unicodedata.normalize("NFC", text)
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


def _fold(text: str) -> str:
    """Lower case without accents (NFKD, combining marks dropped): "Café" -> "cafe"."""
    folded = unicodedata.normalize("NFKD", text)
    return "".join(c for c in folded if not unicodedata.combining(c)).lower()


# --- stored and spoken forms ----------------------------------------------------------------

def tidy_text(text: str | None) -> str:
    """A transcript as it is stored: NFC, format characters dropped, every run of
    whitespace or other control characters one space, no space at either end."""
    if not text:
        return ""
    text = _visible(str(text))
    text = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return (0x3040 <= code <= 0x30FF or 0x3400 <= code <= 0x4DBF or 0x4E00 <= code <= 0x9FFF
            or 0xAC00 <= code <= 0xD7AF or 0xF900 <= code <= 0xFAFF)


def _is_pictograph(ch: str, category: str) -> bool:
    # Symbols below the arrows block are readable (degree, copyright, trademark,
    # numero); arrows, dingbats, box drawing and emoji are not.
    return category == "So" and ord(ch) >= 0x2190


def clean_text(text: str) -> str:
    """Normalise `text` for the model, or raise `InputError` saying what is wrong.

    Refuses: empty text, text with nothing to pronounce, control characters,
    private-use or unassigned code points, and emoji/pictographs (the model has
    no reading for them, and guessing would put words in the user's mouth).
    """
    if text is None or not text.strip():
        raise InputError("The text to speak is empty.", "Give at least one word.")
    out: list[str] = []
    for index, ch in enumerate(_visible(text)):
        ch = _REPLACE.get(ch, ch)
        if len(ch) == 1:
            category = unicodedata.category(ch)
            if ch in "\t\r\n\f\v":
                ch = "\n" if ch in "\r\n\f\v" else " "
            elif category in ("Cc", "Co", "Cn", "Cs") or _is_pictograph(ch, category):
                name = unicodedata.name(ch, "unnamed character")
                raise InputError(
                    f"The text contains an unsupported character {ch!r} "
                    f"(U+{ord(ch):04X} {name.lower()}) at position {index + 1}.",
                    "Remove it or write it out in words.",
                )
        out.append(ch)
    cleaned = "".join(out)
    # Paragraph breaks stay as single newlines (they become longer pauses);
    # every other run of whitespace becomes one space.
    cleaned = re.sub(r"[ \t]*\n[ \t\n]*", "\n", cleaned)
    cleaned = re.sub(r"[ \t]+", " ", cleaned).strip()
    if not any(unicodedata.category(c)[0] in "LN" for c in cleaned):
        raise InputError("The text has nothing to pronounce (no letters or digits).",
                         "Give at least one word.")
    return cleaned


def training_text(text: str) -> str:
    """A stored transcript in the form speaking feeds the model (`clean_text`), on one line.

    Training on the same normal form means the model never sees at inference a
    token sequence that training wrote differently. Text `clean_text` refuses
    stays as it was: the clip was already judged usable, and leaving it out is
    the quality gate's call, not the normaliser's.
    """
    try:
        return clean_text(text).replace("\n", " ")
    except InputError:
        return text


# --- text written for reading, as it is spoken ---------------------------------------------

#: Qwen3-TTS's languages (a voice's recorded `language`) as ISO 639-1 codes
MODEL_LANGUAGE_NAMES = {"english": "en", "chinese": "zh", "japanese": "ja", "korean": "ko",
                  "german": "de", "french": "fr", "russian": "ru", "portuguese": "pt",
                  "spanish": "es", "italian": "it"}


def language_code(language: str | None) -> str | None:
    """A language as a BCP-47 tag ("English" -> "en", "en_us" -> "en-US"), or None when
    it names no language ("", "auto", a name the model does not speak)."""
    raw = (language or "").strip()
    if raw.lower() in MODEL_LANGUAGE_NAMES:
        return MODEL_LANGUAGE_NAMES[raw.lower()]
    match = re.fullmatch(r"([A-Za-z]{2,3})(?:[-_]([A-Za-z]{2}|\d{3}))?", raw)
    if not match or raw.lower() == "auto":
        return None
    region = match.group(2)
    return match.group(1).lower() + (f"-{region.upper()}" if region else "")


# Markdown as a language model writes it: each rule keeps what is read aloud.
_MD_FENCE = re.compile(r"^[ \t]*(?:```|~~~).*$", re.M)
_MD_RULE = re.compile(r"^[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*$", re.M)
_MD_TABLE_RULE = re.compile(r"^[ \t]*\|?(?:[ \t]*:?-{2,}:?[ \t]*\|?)+[ \t]*$", re.M)
_MD_HEADER = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.M)
_MD_ITEM = re.compile(r"^[ \t]*(?:>[ \t]?)*(?:[-*+\u2022][ \t]+|\d{1,3}[.)][ \t]+)?", re.M)
_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\((?:[^()]|\([^)]*\))*\)")
_MD_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_MD_HTML = re.compile(r"</?[A-Za-z][^<>]*>")
_MD_STRONG = re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1")
_MD_EMPHASIS = re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])"
                          r"|(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])")
_MD_CODE = re.compile(r"`+([^`\n]*)`+")

# Emoji and what builds them: pictographs (`_is_pictograph`), their variation selectors,
# skin tones and the keycap mark; joiners and tags are format characters (`_visible`).
_EMOJI_PARTS = frozenset({"\ufe0e", "\ufe0f", "\u20e3"})


def _is_emoji_part(ch: str) -> bool:
    return (ch in _EMOJI_PARTS or 0x1F3FB <= ord(ch) <= 0x1F3FF
            or _is_pictograph(ch, unicodedata.category(ch)))


def _unmark_line(line: str) -> str:
    """One line without its list, quote or table marks; a header or an item ends as a
    sentence (a period where it has no end mark), so it is said as one."""
    item = _MD_ITEM.match(line)
    body = line[item.end():] if item else line
    header = _MD_HEADER.fullmatch(body)
    if header:
        body = header.group(1)
    if body.count("|") >= 2:  # a table row: its cells, one after the other
        body = ", ".join(c.strip() for c in body.strip().strip("|").split("|") if c.strip())
    body = body.strip()
    marked = bool(header) or bool(item and item.end() > len(line) - len(line.lstrip()))
    if marked and body and body[-1] not in _ENDERS + _CLOSERS + ":,":
        body += "."
    return body


def _unmark(text: str) -> str:
    """Markdown's marks taken out, what they mark kept (a link's text, not its address)."""
    text = _MD_FENCE.sub("", text)
    text = _MD_RULE.sub("", text)
    text = _MD_TABLE_RULE.sub("", text)
    text = _MD_IMAGE.sub(r"\1", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_AUTOLINK.sub(r"\1", text)
    text = _MD_HTML.sub("", text)
    text = "\n".join(_unmark_line(line) for line in text.split("\n"))
    for _ in range(2):  # "***both***": strong, then emphasis inside it
        text = _MD_STRONG.sub(r"\2", text)
        text = _MD_EMPHASIS.sub(lambda m: m.group(1) or m.group(2), text)
    return _MD_CODE.sub(r"\1", text)


def _words_table(spec: str) -> dict[str, tuple[str, str]]:
    """"km=kilometer|kilometers; %=percent" as {"km": ("kilometer", "kilometers"), ...}."""
    table = {}
    for entry in spec.split(";"):
        symbol, _, words = entry.strip().partition("=")
        one, _, many = words.partition("|")
        table[symbol] = (one, many or one)
    return table


# Units after a number, each language's singular|plural words.
_UNITS = {code: _words_table(spec) for code, spec in {
    "en": "%=percent; °C=degree Celsius|degrees Celsius; °F=degree Fahrenheit|degrees Fahrenheit;"
          " °=degree|degrees; km/h=kilometer per hour|kilometers per hour;"
          " mph=mile per hour|miles per hour; kWh=kilowatt hour|kilowatt hours;"
          " kW=kilowatt|kilowatts; W=watt|watts; km=kilometer|kilometers;"
          " cm=centimeter|centimeters; mm=millimeter|millimeters; m=meter|meters;"
          " kg=kilogram|kilograms; mg=milligram|milligrams; g=gram|grams;"
          " ml=milliliter|milliliters; l=liter|liters; min=minute|minutes; h=hour|hours;"
          " s=second|seconds",
    "de": "%=Prozent; °C=Grad Celsius; °F=Grad Fahrenheit; °=Grad;"
          " km/h=Kilometer pro Stunde; kWh=Kilowattstunde|Kilowattstunden; kW=Kilowatt;"
          " W=Watt; km=Kilometer; cm=Zentimeter; mm=Millimeter; m=Meter; kg=Kilogramm;"
          " mg=Milligramm; g=Gramm; ml=Milliliter; l=Liter; min=Minute|Minuten;"
          " h=Stunde|Stunden; s=Sekunde|Sekunden",
    "fr": "%=pour cent; °C=degré Celsius|degrés Celsius; °F=degré Fahrenheit|degrés Fahrenheit;"
          " °=degré|degrés; km/h=kilomètre heure|kilomètres heure;"
          " kWh=kilowattheure|kilowattheures; kW=kilowatt|kilowatts; W=watt|watts;"
          " km=kilomètre|kilomètres; cm=centimètre|centimètres; mm=millimètre|millimètres;"
          " m=mètre|mètres; kg=kilogramme|kilogrammes; g=gramme|grammes; l=litre|litres;"
          " min=minute|minutes; h=heure|heures",
    "es": "%=por ciento; °C=grado Celsius|grados Celsius; °=grado|grados;"
          " km/h=kilómetro por hora|kilómetros por hora; km=kilómetro|kilómetros;"
          " cm=centímetro|centímetros; m=metro|metros; kg=kilo|kilos; g=gramo|gramos;"
          " l=litro|litros; min=minuto|minutos; h=hora|horas",
    "it": "%=percento; °C=grado Celsius|gradi Celsius; °=grado|gradi;"
          " km/h=chilometro orario|chilometri orari; km=chilometro|chilometri;"
          " cm=centimetro|centimetri; m=metro|metri; kg=chilo|chili; g=grammo|grammi;"
          " l=litro|litri; min=minuto|minuti; h=ora|ore",
    "pt": "%=por cento; °C=grau Celsius|graus Celsius; °=grau|graus;"
          " km/h=quilômetro por hora|quilômetros por hora; km=quilômetro|quilômetros;"
          " cm=centímetro|centímetros; m=metro|metros; kg=quilo|quilos; g=grama|gramas;"
          " l=litro|litros; min=minuto|minutos; h=hora|horas",
}.items()}
#: currency signs before an amount: each language's singular|plural names
_CURRENCIES = {code: _words_table(spec) for code, spec in {
    "en": "$=dollar|dollars; €=euro|euros; £=pound|pounds",
    "de": "$=Dollar; €=Euro; £=Pfund",
    "fr": "$=dollar|dollars; €=euro|euros; £=livre|livres",
    "es": "$=dólar|dólares; €=euro|euros; £=libra|libras",
    "it": "$=dollaro|dollari; €=euro; £=sterlina|sterline",
    "pt": "$=dólar|dólares; €=euro|euros; £=libra|libras",
}.items()}
#: the word between a decimal number's whole part and its digits
_POINT = {"en": "point", "de": "Komma", "fr": "virgule", "es": "coma", "it": "virgola",
          "pt": "vírgula"}
#: languages that write 3,5 for three and a half (and 1.250 for a thousand and more)
_DECIMAL_COMMA = frozenset({"de", "fr", "es", "it", "pt", "ru"})


def _number_pattern(code: str) -> str:
    point, group = (",", ".") if code in _DECIMAL_COMMA else (".", ",")
    g, p = re.escape(group), re.escape(point)
    return rf"(?<![\w.,])-?(?:\d{{1,3}}(?:{g}\d{{3}})+|\d+)(?:{p}\d+)?(?![\d])"


def _say_number(raw: str, code: str) -> str | None:
    """A written number in words (None: the language has no speller here, keep it)."""
    # start-up cost: num2words loads every language's module (0.1 s); only text to speak needs it
    from num2words import num2words  # noqa: PLC0415

    point, group = (",", ".") if code in _DECIMAL_COMMA else (".", ",")
    negative, raw = raw.startswith("-"), raw.lstrip("-")
    whole, _, fraction = raw.replace(group, "").partition(point)
    try:
        if code == "en" and not negative and not fraction and len(raw) == 4 \
                and 1100 <= int(whole) <= 2099 and not 2000 <= int(whole) <= 2009:
            words = num2words(int(whole), lang=code, to="year")  # "nineteen eighty-four"
        else:
            words = num2words(-int(whole) if negative else int(whole), lang=code)
        if fraction:
            if code in _POINT:
                digits = " ".join(num2words(int(d), lang=code) for d in fraction)
                words = f"{words} {_POINT[code]} {digits}"
            else:
                words = num2words(float(f"{'-' if negative else ''}{whole}.{fraction}"),
                                  lang=code)
    except (NotImplementedError, OverflowError, ValueError):
        return None
    return words.replace(",", "")


def _plural(raw: str, code: str) -> bool:
    point = "," if code in _DECIMAL_COMMA else "."
    return raw.lstrip("-") not in ("1", f"1{point}0")


def _say_numbers(text: str, code: str) -> str:
    """Amounts, times, ordinals, numbers with units and plain numbers in words."""
    number = _number_pattern(code)
    units = _UNITS.get(code, {})
    currencies = _CURRENCIES.get(code, {})

    def said(raw: str) -> str:
        return _say_number(raw, code) or raw

    if currencies:
        signs = "".join(re.escape(s) for s in currencies)

        def money(m: re.Match[str]) -> str:
            one, many = currencies[m.group(1)]
            whole, _, cents = m.group(2).partition("," if code in _DECIMAL_COMMA else ".")
            amount = f"{said(whole)} {many if _plural(whole, code) else one}"
            # "$3.50": three dollars fifty, as an amount is said
            return f"{amount} {said(cents)}" if cents.strip("0") else amount

        text = re.sub(rf"([{signs}])\s?({number})", money, text)
    if units:
        symbols = "|".join(re.escape(u) for u in sorted(units, key=len, reverse=True))

        def unit(m: re.Match[str]) -> str:
            one, many = units[m.group(2)]
            return f"{said(m.group(1))} {many if _plural(m.group(1), code) else one}"

        text = re.sub(rf"({number})\s?({symbols})(?![\w/])", unit, text)
    if code == "en":
        def ordinal(m: re.Match[str]) -> str:
            from num2words import num2words  # start-up cost, as in `_say_number`  # noqa: PLC0415

            return str(num2words(int(m.group(1)), lang="en", to="ordinal"))

        text = re.sub(r"\b(\d+)(?:st|nd|rd|th)\b", ordinal, text)

    def clock(m: re.Match[str]) -> str:
        hour, minute = int(m.group(1)), int(m.group(2))
        if code == "en":
            rest = ("o'clock" if minute == 0 else f"oh {said(str(minute))}" if minute < 10
                    else said(str(minute)))
            return f"{said(str(hour))} {rest}"
        return f"{said(str(hour))} {said(str(minute))}" if minute else said(str(hour))

    text = re.sub(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])", clock, text)
    return re.sub(number, lambda m: said(m.group(0)), text)


#: the least confidence (of 1) at which a sentence's detected language is believed: a
#: few words ("OK.") say too little, and then the fallback's language speaks its numbers
DETECT_CONFIDENCE = 0.5


@functools.cache
def _identifier() -> Any:
    """py3langid's identifier (an offline model in its wheel), narrowed to the languages
    the model speaks: a sentence is one of them, or said in the fallback's."""
    # start-up cost: the model takes a second to load; only text to speak needs it
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier  # noqa: PLC0415

    identifier = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
    identifier.set_languages(sorted(set(MODEL_LANGUAGE_NAMES.values())))
    return identifier


def detect_language(text: str) -> str | None:
    """The language `text` is written in, as an ISO 639-1 code of one the model speaks;
    None when its words are too few to tell (`DETECT_CONFIDENCE`)."""
    if not any(c.isalpha() for c in text):
        return None
    code, confidence = _identifier().classify(text)
    return str(code) if confidence >= DETECT_CONFIDENCE else None


def spoken_text(text: str, language: str | None = None, fallback: str | None = None) -> str:
    """Text written to be read (a language model's reply, an article) as it is spoken:
    markdown's marks taken out and what they mark kept, emoji dropped, numbers, amounts,
    times and units in words. Empty when nothing is left to say. The result is
    `clean_text`'s input; numbers stay digits in a language without a speller here (the
    model reads them).

    Numbers are said in `language` (a name or a BCP-47 tag) when it is given; else each
    sentence's in the language it is written in (`detect_language`), and where that
    cannot be told, in `fallback`'s (a voice's own language), else English."""
    text = _unmark(_visible(text or ""))
    text = "".join(" " if _is_emoji_part(ch) else ch for ch in text)
    given = language_code(language)
    default = (language_code(fallback) or "en").split("-")[0]

    def said(sentence: str) -> str:
        if not any(c.isdigit() for c in sentence):
            return sentence  # no number to say: no language to find
        code = given.split("-")[0] if given else detect_language(sentence) or default
        return _say_numbers(sentence, code)

    text = "\n".join(join_sentences([said(s) for s in _paragraph_sentences(line)])
                     for line in text.split("\n"))
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" +([,.!?;:])", r"\1", text)
    lines = (line.strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if any(c.isalnum() for c in line))


# --- sentences ------------------------------------------------------------------------------

# Marks that end a sentence at once, with or without a space after them
# (full-width stop, exclamation, question mark, semicolon).
_CJK_ENDERS = "\u3002\uff01\uff1f\uff1b"
# Latin marks end a sentence only before whitespace. ";" is one of them: it is
# also what NFC makes of the Greek question mark (U+037E, listed for text not
# yet normalised), and it is a pause where a chunk or a slice may be cut.
_ENDERS = ".!?;\u2026\u203c\u2049\u037e" + _CJK_ENDERS
# Closing quotes and brackets that belong to the sentence they follow (German closes
# with “ and «, French with »).
_CLOSERS = ("\"')]}\u2018\u2019\u201c\u201d\u00ab\u00bb\u2039\u203a"
            "\u300d\u300f\uff09")

# A period after these never ends a sentence: they stand before the name or
# the example they introduce ("Dr. Smith", "e.g. this"). Single letters join
# them (initials: "J. R. R. Tolkien").
_TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "mt", "vs", "e.g", "i.e"})
# A period after these ends a sentence only before a capital letter: "No. 5",
# "etc. and", "Jan. 3", "Smith Jr. was" go on, "The answer is no. Then" ends.
# Words with a period inside ("U.S.", "p.m.", "3.5") follow the same rule.
_ABBREVIATIONS = frozenset({
    "no", "etc", "sr", "jr", "fig", "approx", "inc", "ltd", "co", "jan", "feb", "mar",
    "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})


def _last_word(text: str) -> str:
    """The word a period follows: the last token, opening quotes and brackets aside."""
    tokens = text.split()
    return re.sub(r"^[^\w]+", "", tokens[-1]).lower() if tokens else ""


def _period_ends_sentence(word: str, rest: str) -> bool:
    """Does a period after `word` end the sentence, `rest` being the text after the space?"""
    if word in _TITLES or (len(word) == 1 and word.isalpha()):
        return False
    if word in _ABBREVIATIONS or "." in word:
        following = rest.split(maxsplit=1)[0] if rest.strip() else ""
        first = next((c for c in following if c.isalnum()), "")
        return not (first.islower() or first.isdigit())
    return True


def _paragraph_sentences(paragraph: str) -> list[str]:
    sentences: list[str] = []
    start = i = 0
    n = len(paragraph)
    while i < n:
        ch = paragraph[i]
        if ch not in _ENDERS:
            i += 1
            continue
        # the whole run of marks and closers ("?!", '."', "...)") ends together
        j = i + 1
        while j < n and (paragraph[j] in _ENDERS or paragraph[j] in _CLOSERS):
            j += 1
        if j >= n or ch in _CJK_ENDERS:
            boundary = True
        elif not paragraph[j].isspace():
            boundary = False  # "3.5", "a.m", "Hello.World"
        elif ch == "." and start == 0 and paragraph[:i].strip().isdigit():
            boundary = False  # "1. Buy milk": an ordered list's number, not a sentence
        elif ch == ".":
            boundary = _period_ends_sentence(_last_word(paragraph[start:i]), paragraph[j:])
        else:
            boundary = True
        if boundary:
            sentence = paragraph[start:j].strip()
            if sentence:
                sentences.append(sentence)
            start = j
        i = j
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, in order; a line break always ends one.

    Each sentence is the text between its boundaries, stripped: for text tidied
    to single spaces, `join_sentences` puts them back together.
    """
    return [s for line in text.split("\n") for s in _paragraph_sentences(line)]


def complete_sentences(text: str) -> tuple[list[str], str]:
    """The sentences of text still arriving that are surely complete, and the rest.

    A sentence is complete once text after it confirms its end (a period at the very end
    may still be "Dr." or "3." of "3.5"); a line break ends one at once. The rest is what
    to keep and extend: its sentences are `split_sentences(rest)` when no more comes.
    """
    lines = text.split("\n")
    done = [s for line in lines[:-1] for s in _paragraph_sentences(line)]
    last = lines[-1]
    # after a space, the next word decides only after an abbreviation ("etc. and"): a
    # lower-case stand-in keeps that one open and closes every other sentence
    sentences = _paragraph_sentences(last + "x" if last[-1:].isspace() else last)
    if len(sentences) < 2:
        return done, last
    # the last sentence is the rest, from where it starts in the line
    start = 0
    for sentence in sentences[:-1]:
        start = last.index(sentence, start) + len(sentence)
    return done + sentences[:-1], last[start:]


def _join(left: str, right: str) -> str:
    # CJK writing puts no space between sentences (or words)
    return f"{left} {right}" if left and right and not _is_cjk(right[0]) else left + right


def join_sentences(sentences: list[str]) -> str:
    """Consecutive sentences as one text: a space between them, none before CJK."""
    out = ""
    for sentence in sentences:
        out = _join(out, sentence)
    return out


# --- chunks for speaking --------------------------------------------------------------------

# Inside-sentence pause points used to split a sentence that is too long.
_SOFT_BREAKS = re.compile(r"(?<=[,:\u3001\uff0c\uff1a])\s*|\s+(?=-\s)")


def spoken_weight(text: str) -> float:
    """Rough speaking length in 'Latin character' units.

    A CJK character is a syllable or more, about three Latin letters of speech.
    Used to cap generated length and to balance chunks.
    """
    return sum(3.0 if _is_cjk(ch) else 1.0 for ch in text if not ch.isspace())


def max_frames_for(text: str, frames_per_unit: float = 2.5, floor: int = 40,
                   ceiling: int = 2048) -> int:
    """Cap on codec frames for `text`, so a missing end-of-speech cannot run forever.

    Natural English speech is about 15 characters per second, 12.5 frames per
    second, so about 0.85 frames per character; 2.5 leaves room for slow,
    expressive reading without letting a runaway generation go on for minutes.
    """
    return int(min(ceiling, max(floor, floor + frames_per_unit * spoken_weight(text))))


@dataclass(frozen=True)
class Chunk:
    """One generation unit: a few sentences, and the pause that follows it."""

    index: int
    text: str
    #: seconds of silence after this chunk (0 for the last one)
    pause_after_s: float
    #: cap on codec frames for this chunk
    max_frames: int


def _split_long(sentence: str, limit: int) -> list[str]:
    """Cut a sentence longer than `limit` at commas, then at spaces, then anywhere."""
    if spoken_weight(sentence) <= limit:
        return [sentence]
    pieces = [p for p in _SOFT_BREAKS.split(sentence) if p and p.strip()]
    if len(pieces) > 1:
        out: list[str] = []
        for piece in _pack(pieces, limit):
            out.extend(_split_long(piece, limit) if spoken_weight(piece) > limit else [piece])
        return out
    words = sentence.split(" ")
    if len(words) > 1:
        return _pack(words, limit)
    # one unbroken run (e.g. CJK without punctuation): hard cut
    step = max(1, int(limit / 3) if _is_cjk(sentence[0]) else limit)
    return [sentence[k:k + step] for k in range(0, len(sentence), step)]


def _pack(parts: list[str], limit: int) -> list[str]:
    """Greedily join consecutive parts while the result stays under `limit`."""
    chunks: list[str] = []
    current = ""
    for part in parts:
        part = part.strip()
        if not part:
            continue
        joined = _join(current, part)
        if current and spoken_weight(joined) > limit:
            chunks.append(current)
            current = part
        else:
            current = joined
    if current:
        chunks.append(current)
    return chunks


def split_text(text: str, chunk_chars: int = DEFAULT_CHUNK_CHARS, sentence_pause_s: float = 0.3,
               paragraph_pause_s: float = 0.6, frames_per_unit: float = 2.5,
               max_frames: int | None = None) -> list[Chunk]:
    """Clean `text` and split it into chunks at sentence boundaries.

    Sentences are packed together up to `chunk_chars` (in `spoken_weight`
    units); a single sentence longer than that is cut at commas or spaces.
    Chunks never span a paragraph break, which gets the longer pause.
    """
    if chunk_chars < 20:
        raise InputError(f"The chunk size {chunk_chars} is too small.",
                         "Use at least 20 characters per chunk.")
    if chunk_chars > MAX_CHUNK_CHARS:
        raise InputError(f"The chunk size {chunk_chars} is too large.",
                         f"Use at most {MAX_CHUNK_CHARS} characters per chunk.")
    cleaned = clean_text(text)
    texts: list[tuple[str, float]] = []
    paragraphs = [p for p in cleaned.split("\n") if p.strip()]
    for p_index, paragraph in enumerate(paragraphs):
        sentences: list[str] = []
        for sentence in _paragraph_sentences(paragraph):
            sentences.extend(_split_long(sentence, chunk_chars))
        packed = _pack(sentences, chunk_chars)
        for s_index, chunk_text in enumerate(packed):
            last_in_paragraph = s_index == len(packed) - 1
            pause = paragraph_pause_s if last_in_paragraph else sentence_pause_s
            if p_index == len(paragraphs) - 1 and last_in_paragraph:
                pause = 0.0
            texts.append((chunk_text, pause))
    chunks = []
    for index, (chunk_text, pause) in enumerate(texts):
        cap = max_frames_for(chunk_text, frames_per_unit)
        if max_frames is not None:
            cap = min(cap, max_frames)
        chunks.append(Chunk(index=index, text=chunk_text, pause_after_s=pause, max_frames=cap))
    return chunks


# --- words as compared ----------------------------------------------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# What recognisers write that nobody said: pocketsphinx's alternative
# pronunciations ("word(2)") and its silence, noise and filler markers.
_MARKER = re.compile(r"\(\d+\)$")
_FILLERS = frozenset({"<s>", "</s>", "<sil>", "[noise]", "[speech]", "[laughter]", "[breath]",
                      "[cough]", "[music]"})
_TO_APOSTROPHE = str.maketrans(dict.fromkeys(_APOSTROPHES, "'"))


def number_words(n: int) -> str:
    """English words for 0 <= n < 1,000,000 ("one hundred twenty three")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_words(rest))
    rest = n % 1000
    return number_words(n // 1000) + " thousand" + ("" if rest == 0 else
                                                    " " + number_words(rest))


def _spell_numbers(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        digits = m.group(0).replace(",", "")
        value = int(digits)
        return f" {number_words(value)} " if value < 1_000_000 else f" {digits} "

    return re.sub(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+", one, text)


def wer_words(text: str | None) -> list[str]:
    """The words of `text` as a word error rate compares them.

    Lower case without accents, punctuation dropped (apostrophes inside words
    kept: "didn't"), "&" read as "and", numbers up to a million spelled out
    ("1,250" -> one thousand two hundred fifty), recogniser markers removed. So
    "Dr. Smith paid $12." and "dr smith paid twelve" differ only where the words do.
    """
    if not text:
        return []
    folded = _fold(_visible(text)).translate(_TO_APOSTROPHE).replace("&", " and ")
    words = [_MARKER.sub("", raw) for raw in folded.split() if raw not in _FILLERS]
    folded = _spell_numbers(" ".join(words))
    # keep letters, digits and apostrophes inside words
    folded = re.sub(r"[^\w']+", " ", folded)
    folded = re.sub(r"(?<!\w)'|'(?!\w)", " ", folded).replace("_", " ")
    return folded.split()


def comparison_key(text: str | None) -> str:
    """What counts as the same sentence: two texts are one when their word error
    rate against each other is 0 ("Hello, World!" and "hello world"; "12" and
    "twelve"). Empty for text without words."""
    return " ".join(wer_words(text))
