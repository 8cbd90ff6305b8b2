from textkit.slug import slugify


def test_mixed():
    assert slugify("  Ärger & Ölpreis: 2024!! ") == "arger-olpreis-2024"
    assert slugify("naïve / façade") == "naive-facade"
    assert slugify("日本 tokyo") == "tokyo"
