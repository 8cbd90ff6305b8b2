"""URL slugs."""
import re


def slugify(text: str) -> str:
    """Turn `text` into a URL slug.

    - letters with accents become their plain ASCII letter (``é`` -> ``e``, ``Ü`` -> ``u``);
      other non-ASCII characters are dropped;
    - everything is lowercased;
    - every run of characters that are not ASCII letters or digits becomes a single ``-``;
    - the slug never starts or ends with ``-``.
    """
    text = text.lower()
    text = re.sub(r"[^a-z0-9]", "-", text)
    return text.strip("-")
