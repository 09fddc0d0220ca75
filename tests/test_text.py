"""The one text normal form: stored, spoken, split, compared (pure Python, no model)."""

from __future__ import annotations

import random
import unicodedata

import pytest

from engine.core.errors import InputError
from engine.text import (
    clean_text,
    comparison_key,
    detect_language,
    join_sentences,
    language_code,
    max_frames_for,
    number_words,
    split_sentences,
    split_text,
    spoken_text,
    spoken_weight,
    tidy_text,
    training_text,
    wer_words,
)

# --- stored form ------------------------------------------------------------------------------


def _tidy_reference(text: str) -> str:
    """The stored form spelled out one character at a time."""
    out: list[str] = []
    for ch in unicodedata.normalize("NFC", text):
        category = unicodedata.category(ch)
        if category == "Cf":
            continue
        if ch.isspace() or category.startswith("C"):
            if out and out[-1] != " ":
                out.append(" ")
            continue
        out.append(ch)
    return "".join(out).strip()


def test_stored_text_is_tidied_but_keeps_what_the_person_wrote() -> None:
    assert tidy_text(None) == "" and tidy_text("  \n\t ") == ""
    assert tidy_text(" Hello\tthere,\r\n  you\x07 ") == "Hello there, you"
    # the person's own quotes and dashes stay (clean_text maps them for the model only)
    assert tidy_text("\u201cHi\u201d \u2014 ok\u2026") == "\u201cHi\u201d \u2014 ok\u2026"
    # composed: an e and a combining acute become one letter
    assert tidy_text("cafe\u0301") == "caf\u00e9"
    # a format character sits inside a word: dropped, not a space (the old take-text
    # rule split "hyphen\u00adation" into two words)
    assert tidy_text("\ufeffhyphen\u00adation zero\u200bwidth") == "hyphenation zerowidth"


def test_stored_text_matches_a_character_by_character_reference() -> None:
    rng = random.Random(7)
    alphabet = list("ab \t\n\r\x07\x00\u00a0\u2009\u3000\u00ad\u200b\ufeff\u0301e\ue000\U0001F600.")
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        assert tidy_text(text) == _tidy_reference(text), repr(text)


# --- spoken form --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_text_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="empty"):
        clean_text(text)


def test_text_without_words_is_refused() -> None:
    with pytest.raises(InputError, match="nothing to pronounce"):
        clean_text("... !!! ???")


@pytest.mark.parametrize("bad,code", [("Hi \U0001F600 there", "U+1F600"),
                                      ("bell\x07", "U+0007"),
                                      ("private \ue000 use", "U+E000"),
                                      ("scissors \u2702 here", "U+2702")])
def test_unsupported_characters_are_named_with_their_position(bad: str, code: str) -> None:
    with pytest.raises(InputError) as info:
        clean_text(bad)
    message = str(info.value)
    assert code in message and "position" in message
    assert message.count(".") <= 3  # one sentence plus the hint


def test_invisible_and_typographic_characters_are_normalised() -> None:
    text = "\ufeffShe said \u201chello\u201d\u200b \u2014 twice\u2026 25\u00b0C"
    assert clean_text(text) == 'She said "hello" - twice... 25\u00b0C'
    # paragraph breaks stay (they become longer pauses); the stored form has none
    assert clean_text("One.\r\n\r\n  Two.") == "One.\nTwo."


def test_training_text_is_the_spoken_form_on_one_line() -> None:
    raw = "\u201cWell\u201d \u2014 it\u2019s  fine\u2026"
    assert training_text(raw) == clean_text(raw) == '"Well" - it\'s fine...'
    assert training_text("\u201cWell\u201d\nit\u2019s fine") == '"Well" it\'s fine'
    assert training_text("\U0001F600") == "\U0001F600"  # refused by synthesis: kept as is


# --- sentences ----------------------------------------------------------------------------------

_TITLES = {"mr", "mrs", "ms", "dr", "prof", "st", "mt", "vs", "e.g", "i.e"}
_ABBREVIATIONS = {"no", "etc", "sr", "jr", "fig", "approx", "inc", "ltd", "co", "jan", "feb",
                  "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"}
_MARKS = ".!?;\u2026"
_CLOSING = "\"')\u201d"


def _sentences_reference(text: str) -> list[str]:
    """The rule on whitespace tokens of single-spaced Latin text, one token at a time.

    A token ends a sentence when it ends in marks (closers after them allowed),
    unless the first mark is a period after a title or an initial, or after an
    abbreviation (or a word with a period inside) when the next token starts
    with a lowercase letter or a digit, or after a number that starts the text (a
    numbered list's). The last token always ends one.
    """
    tokens = text.split(" ")
    out: list[list[str]] = [[]]
    for k, token in enumerate(tokens):
        out[-1].append(token)
        body = token.rstrip(_CLOSING)
        run = len(body) - len(body.rstrip(_MARKS))
        if run == 0 or k == len(tokens) - 1:
            continue
        first_mark = body[len(body) - run]
        ends = True
        if first_mark == ".":
            word = body[: len(body) - run].lstrip("\"'(\u201c").lower()
            nxt = next((c for c in tokens[k + 1] if c.isalnum()), "")
            if word in _TITLES or (len(word) == 1 and word.isalpha()):
                ends = False
            elif k == 0 and body[: len(body) - run].isdigit():
                ends = False  # "1. Buy milk": a numbered list's number starts the line
            elif word in _ABBREVIATIONS or "." in word:
                ends = not (nxt.islower() or nxt.isdigit())
        if ends:
            out.append([])
    return [" ".join(s) for s in out if s]


def test_sentences_match_a_token_by_token_reference() -> None:
    vocab = ["word", "Word", "Dr.", "dr.", "No.", "no.", "etc.", "Jan.", "J.", "U.S.", "3.5",
             "5", "5.", "it.", "It.", "end!", "what?!", "so;", "wait...", "hm\u2026", '"Hi."',
             "(etc.)", "\u201cHi.\u201d", "and", "e.g.", "Jr.", "St.", "x.y", "Inc.", "vs.",
             "p.m.", "(see", '"Then', "a.", "A."]
    rng = random.Random(3)
    for _ in range(5000):
        text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 8)))
        got = split_sentences(text)
        assert got == _sentences_reference(text), text
        assert join_sentences(got) == text  # nothing lost: closers stay with their sentence


@pytest.mark.parametrize("text,expected", [
    # titles and initials never end a sentence (both old splitters agreed on titles;
    # only the synth one knew initials: prepare cut "J." "R." "R." apart)
    ("Dr. Smith met J. R. R. Tolkien. Then he left.",
     ["Dr. Smith met J. R. R. Tolkien.", "Then he left."]),
    # "No." was never an end in both: an answer is one, a number sign is not
    ("Did he come back? No. He left at No. 5 Main St. today.",
     ["Did he come back?", "No.", "He left at No. 5 Main St. today."]),
    # "etc." ends before a capital, not before a lowercase word
    ("Cups, plates etc. and more. Knives etc. Then forks.",
     ["Cups, plates etc. and more.", "Knives etc.", "Then forks."]),
    # months before a day (prepare split "Jan." from "5"), dotted words before lowercase
    ("It opened on Jan. 5 at 9 a.m. sharp. The U.S. team won.",
     ["It opened on Jan. 5 at 9 a.m. sharp.", "The U.S. team won."]),
    # ";" and "…" end a sentence (prepare knew no ";", synth no "…": it had been cleaned)
    ("Be careful; the floor is wet\u2026 Really!", ["Be careful;", "the floor is wet\u2026",
                                                  "Really!"]),
    # closing quotes stay with their sentence (prepare dropped them, and never split
    # after a curly one)
    ('He said "hi." Then \u201cbye.\u201d Done.',
     ['He said "hi."', "Then \u201cbye.\u201d", "Done."]),
    # decimals and runs of marks
    ("It costs 3.5 dollars?! Yes.", ["It costs 3.5 dollars?!", "Yes."]),
    # full-width marks end a sentence without a space; a line break always does
    ("\u6211\u5f88\u597d\u3002\u8c22\u8c22\uff01\nNext line", ["\u6211\u5f88\u597d\u3002",
                                                          "\u8c22\u8c22\uff01", "Next line"]),
])
def test_sentence_rules_where_the_old_splitters_disagreed(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_cjk_sentences_join_without_a_space() -> None:
    text = "\u6211\u5f88\u597d\u3002\u8c22\u8c22\uff01\u518d\u89c1\u3002"
    assert len(split_sentences(text)) == 3
    assert join_sentences(split_sentences(text)) == text
    assert join_sentences(["Hi.", "\u518d\u89c1\u3002", "Bye."]) == "Hi.\u518d\u89c1\u3002 Bye."


def test_greek_question_mark_ends_a_sentence_before_and_after_nfc() -> None:
    greek = "\u03a0\u03bf\u03cd \u03b5\u03af\u03c3\u03b1\u03b9\u037e \u0395\u03b4\u03ce."
    assert len(split_sentences(greek)) == 2
    assert len(split_sentences(tidy_text(greek))) == 2


# --- chunks -------------------------------------------------------------------------------------


def test_sentences_are_kept_whole_and_abbreviations_do_not_split() -> None:
    text = "Dr. Smith paid 3.5 dollars. Then he left! Did he come back? No."
    chunks = split_text(text, chunk_chars=30)
    joined = " ".join(c.text for c in chunks)
    assert joined == text
    assert chunks[0].text.startswith("Dr. Smith paid 3.5 dollars.")
    for chunk in chunks:
        assert chunk.text[-1] in ".!?"


def test_long_text_is_chunked_under_the_limit_with_pauses() -> None:
    sentence = "This sentence has exactly eight words in it."
    text = " ".join([sentence] * 12) + "\n\n" + "A new paragraph starts here."
    chunks = split_text(text, chunk_chars=100, sentence_pause_s=0.25, paragraph_pause_s=0.7)
    assert len(chunks) >= 5
    assert all(spoken_weight(c.text) <= 100 for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    # the paragraph break gets the long pause, the end none
    assert chunks[-2].pause_after_s == 0.7
    assert chunks[-1].pause_after_s == 0.0
    assert {c.pause_after_s for c in chunks[:-2]} == {0.25}


def test_a_sentence_longer_than_a_chunk_is_cut_at_commas() -> None:
    text = ", ".join(f"item number {i}" for i in range(30)) + "."
    chunks = split_text(text, chunk_chars=60)
    assert len(chunks) > 3
    # the limit counts spoken characters (spaces are free)
    assert all(spoken_weight(c.text) <= 60 for c in chunks)
    assert all(c.text.endswith((",", ".")) for c in chunks)
    assert " ".join(c.text for c in chunks).replace(" ", "") == text.replace(" ", "")


def test_cjk_text_splits_at_full_width_marks_and_weighs_more() -> None:
    sentence = "\u6211\u5f88\u597d\uff0c\u8c22\u8c22\u4f60\u7684\u5173\u5fc3\u3002"
    chunks = split_text(sentence * 2, chunk_chars=30)
    assert [c.text for c in chunks] == [sentence, sentence]
    assert max_frames_for("\u6211\u5f88\u597d") > max_frames_for("abc")


def test_length_cap_grows_with_text_and_honours_a_user_cap() -> None:
    short, long = max_frames_for("Hi."), max_frames_for("word " * 100)
    assert 40 <= short < long <= 2048
    chunks = split_text("word " * 100, max_frames=50)
    assert all(c.max_frames <= 50 for c in chunks)


# --- words as compared --------------------------------------------------------------------------


def test_wer_words_fold_case_punctuation_numbers_and_recogniser_markers() -> None:
    assert wer_words("Dr. Smith paid $12, didn\u2019t he?") == \
        ["dr", "smith", "paid", "twelve", "didn't", "he"]
    assert wer_words("to(3) <sil> THE [NOISE] 1,250") == \
        ["to", "the", "one", "thousand", "two", "hundred", "fifty"]
    assert wer_words("Caf\u00e9 & cr\u00e8me, 'quoted' rock_n_roll") == \
        ["cafe", "and", "creme", "quoted", "rock", "n", "roll"]
    assert wer_words("2,000,000 cats") == ["2000000", "cats"]  # a million and more: digits
    assert wer_words("hyphen\u00adation") == ["hyphenation"]  # a soft hyphen is no word break
    assert wer_words(None) == [] and wer_words("... !") == []
    assert number_words(0) == "zero" and number_words(101) == "one hundred one"
    assert number_words(999_999) == ("nine hundred ninety nine thousand nine hundred "
                                     "ninety nine")


def test_the_same_sentence_is_the_same_key() -> None:
    same = [("Hello, World!", "hello world"), ("Caf\u00e9 au lait.", "CAFE AU LAIT"),
            ("I have 12 cats.", "I have twelve cats"), ("Salt & pepper", "salt and pepper"),
            ("\u201cIt\u2019s\u201d here", "it's here")]
    for a, b in same:
        assert comparison_key(a) == comparison_key(b) != "", (a, b)
    different = [("It's here", "Its here"), ("One cat", "One cap")]
    for a, b in different:
        assert comparison_key(a) != comparison_key(b), (a, b)
    assert comparison_key("...") == "" and comparison_key("") == ""


def test_a_language_models_reply_in_its_spoken_form() -> None:
    reply = ("## Weather today \U0001f324\ufe0f\n"
             "It is **21°C** and *sunny* \U0001f600, wind 15 km/h.\n"
             "- Take a [jacket](https://example.com/a_b).\n"
             "1. Buy 2 kg of apples for $3.50\n"
             "> Since 1984, `growth` was 12.5% (1,250 people) \U0001f44d\U0001f3fd\n"
             "```\n| a | b |\n|---|---|\n| x | y |\n```\n---\nMeet at 7:05 on the 2nd floor.")
    assert spoken_text(reply).split("\n") == [
        "Weather today.",
        "It is twenty-one degrees Celsius and sunny, wind fifteen kilometers per hour.",
        "Take a jacket.",
        "Buy two kilograms of apples for three dollars fifty.",
        "Since nineteen eighty-four, growth was twelve point five percent (one thousand two "
        "hundred and fifty people).",
        "a, b", "x, y",
        "Meet at seven oh five on the second floor."]
    # the model can speak all of it: nothing clean_text refuses is left (emoji were)
    assert clean_text(spoken_text(reply)).count("\n") == 7
    assert spoken_text("\U0001f44d **\U0001f389**") == ""  # nothing to say


@pytest.mark.parametrize(("language", "text", "spoken"), [
    ("German", "Es sind 3,5 km bei 21 °C, 1.250 Leute, 2 Stunden, €12,99.",
     "Es sind drei Komma fünf Kilometer bei einundzwanzig Grad Celsius, "
     "eintausendzweihundertfünfzig Leute, zwei Stunden, zwölf Euro neunundneunzig."),
    ("fr", "Il fait 3,5 degrés, 2 km.", "Il fait trois virgule cinq degrés, deux kilomètres."),
    ("es-ES", "Son 20 % más.", "Son veinte por ciento más."),
    ("it", "Sono 3,5 km.", "Sono tre virgola cinque chilometri."),
    # no speller here: the digits stay, the model reads them in its own language
    ("Chinese", "今天 25°C。", "今天 25°C。"),
])
def test_numbers_and_units_in_the_voices_language(language: str, text: str,
                                                  spoken: str) -> None:
    assert spoken_text(text, language) == spoken


def test_numbers_in_each_sentences_own_language() -> None:
    # no language given (Home Assistant sends none, Read's --language auto): each sentence's
    # numbers in the language it is written in, whichever voice reads it
    assert spoken_text("Es sind heute 21 Grad.", fallback="English") == \
        "Es sind heute einundzwanzig Grad."
    assert spoken_text("Listed voice number 5.", fallback="German") == \
        "Listed voice number five."
    assert spoken_text("Es sind 21 Grad. It is 21 degrees.") == \
        "Es sind einundzwanzig Grad. It is twenty-one degrees."
    assert spoken_text("Il fait 3,5 degrés.") == "Il fait trois virgule cinq degrés."
    # too few words to tell: the voice's own language says it
    assert spoken_text("OK 5.", fallback="German") == "OK fünf."
    assert spoken_text("OK 5.") == "OK five."
    # a language given is the language of every sentence
    assert spoken_text("It is 21.", "de") == "It is einundzwanzig."
    assert detect_language("Das Licht im Wohnzimmer ist an.") == "de"
    assert detect_language("42") is None


def test_language_codes_are_bcp47() -> None:
    assert [language_code(x) for x in ("English", "en", "en_us", "pt-BR", "auto", "", None,
                                       "Klingon")] == ["en", "en", "en-US", "pt-BR", None,
                                                        None, None, None]
