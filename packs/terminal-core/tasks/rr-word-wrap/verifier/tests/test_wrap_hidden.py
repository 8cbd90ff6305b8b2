import random

from wraptext.wrap import wrap


def test_properties():
    rng = random.Random(21)
    for _ in range(200):
        width = rng.randint(1, 15)
        words = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 20)))
                 for _ in range(rng.randint(1, 12))]
        lines = wrap(" ".join(words), width)
        assert all(1 <= len(line) <= width for line in lines)
        pieces = [w[i:i + width] for w in words for i in range(0, len(w), width)]
        assert " ".join(lines).split() == pieces
        # greedy: the next piece would not have fitted on the previous line
        for a, b in zip(lines, lines[1:]):
            assert len(a) + 1 + len(b.split()[0]) > width
    assert wrap("abcdefghij", 5) == ["abcde", "fghij"]
    assert wrap("a\n\nb", 1) == ["a", "", "b"]
