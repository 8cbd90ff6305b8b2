"""Override default settings from environment variables.

load(defaults, environ, prefix="APP_") returns a new dict with the keys of `defaults`. For a
key `name`, the variable `<prefix><NAME>` (the key upper-cased) overrides the default if it
is set; its text is converted to the type of the default value:

- bool: "1", "true", "yes", "on" -> True; "0", "false", "no", "off" -> False (any letter
  case, surrounding spaces ignored); anything else raises ValueError;
- int, float: int(text) / float(text) (ValueError when that fails);
- list: the text split on commas, each item stripped of spaces, empty items dropped
  ("a, b,,c" -> ["a", "b", "c"]);
- str: the text as is.

Variables that do not correspond to a key are ignored. Neither argument is modified.
"""


def _convert(text: str, default):
    if isinstance(default, bool):
        return bool(text)
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    if isinstance(default, list):
        return [text]
    return text


def load(defaults: dict, environ: dict, prefix: str = "APP_") -> dict:
    out = dict(defaults)
    for key, default in defaults.items():
        name = prefix + key.upper()
        if name in environ:
            out[key] = _convert(environ[name], default)
    return out
