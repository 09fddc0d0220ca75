"""Text cleaning and chunking for speech (pure Python, no model)."""

from __future__ import annotations

import pytest

from engine.config.speak import SpeakOptions, audio_format
from engine.core.errors import InputError
from engine.text import clean_text, max_frames_for, split_text, spoken_weight


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


def test_options_are_validated_with_clear_messages() -> None:
    with pytest.raises(InputError, match="temperature"):
        SpeakOptions(temperature=0)
    with pytest.raises(InputError, match="top_p"):
        SpeakOptions(top_p=1.5)
    with pytest.raises(InputError, match="Unknown speech option"):
        SpeakOptions.from_dict({"temprature": 0.5})
    assert SpeakOptions.from_dict({"seed": 3}).seed == 3
    assert audio_format("x.flac", None) == "flac"
    assert audio_format("x.oga", None) == "ogg"
    assert audio_format("x", None) == "wav"
    assert audio_format("x.opus", None) == "opus"  # Opus, not Vorbis under an .opus name
    assert audio_format("x.wav", "mp3") == "mp3"
    with pytest.raises(InputError, match="not supported"):
        audio_format("x.wav", "aiff")
    # an extension that names no format is refused, not written as WAV under that name
    for name in ("out.txt", "out.wv", "dir.d/out.mp4"):
        with pytest.raises(InputError, match="not an audio format") as info:
            audio_format(name, None)
        assert info.value.hint and ".mp3" in info.value.hint
    assert audio_format("dir.d/out", None) == "wav"
