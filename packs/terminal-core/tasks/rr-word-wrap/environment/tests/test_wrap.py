import pytest

from wraptext.wrap import wrap


def test_short_text():
    assert wrap("hello world", 20) == ["hello world"]


def test_paragraphs_kept():
    text = "one two\nthree\n\n\nfour"
    assert wrap(text, 40) == ["one two three", "", "four"]


def test_empty():
    assert wrap("", 10) == []
    assert wrap("  \n\n ", 10) == []


def test_bad_width():
    with pytest.raises(ValueError):
        wrap("x", 0)


def test_line_may_fill_the_width():
    assert wrap("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]


def test_long_words_are_split():
    assert wrap("see supercalifragilistic now", 8) == ["see", "supercal", "ifragili", "stic now"]
