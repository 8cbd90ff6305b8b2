from textkit.slug import slugify


def test_basic():
    assert slugify("Hello World") == "hello-world"


def test_empty():
    assert slugify("") == ""
    assert slugify("  !!  ") == ""


def test_digits_kept():
    assert slugify("Top 10 tips") == "top-10-tips"


def test_already_a_slug():
    assert slugify("already-a-slug") == "already-a-slug"


def test_accents_are_transliterated():
    assert slugify("Café Crème") == "cafe-creme"
    assert slugify("Über Straße") == "uber-strae"


def test_separator_runs_collapse():
    assert slugify("a  --  b") == "a-b"
    assert slugify("--x__y--") == "x-y"
