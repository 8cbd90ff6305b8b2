from numerals.roman import from_roman


def test_more_subtractive():
    assert from_roman("XLIX") == 49
    assert from_roman("CDXLIV") == 444
    assert from_roman("MMMCMXCIX") == 3999
