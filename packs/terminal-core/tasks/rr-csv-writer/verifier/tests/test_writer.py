from csvlite.writer import format_row, write_rows


def test_plain():
    assert format_row(["a", "b c", ""]) == "a,b c,"


def test_numbers_and_none():
    assert format_row([1, 2.5, None, True]) == "1,2.5,,True"


def test_write_rows():
    assert write_rows([["x", 1], ["y", 2]]) == "x,1\r\ny,2\r\n"


def test_comma_is_quoted():
    assert format_row(["Hopper, Grace", "x"]) == '"Hopper, Grace",x'


def test_quotes_are_doubled():
    assert format_row(['say "hi"']) == '"say ""hi"""'


def test_line_breaks_are_quoted():
    assert format_row(["two\nlines", "cr\rhere"]) == '"two\nlines","cr\rhere"'
