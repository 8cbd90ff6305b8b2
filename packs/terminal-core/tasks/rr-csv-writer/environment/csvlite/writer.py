"""Write CSV (RFC 4180).

format_row(fields) -> one line without its line ending:
- None becomes an empty field; other values are converted with str();
- a field that contains a comma, a double quote, a carriage return or a line feed is
  enclosed in double quotes, and every double quote inside it is doubled;
- other fields are written as they are.
write_rows(rows) -> the lines joined, each ending with "\r\n".
"""


def format_field(value) -> str:
    if value is None:
        return ""
    return str(value)


def format_row(fields) -> str:
    return ",".join(format_field(f) for f in fields)


def write_rows(rows) -> str:
    return "".join(format_row(r) + "\r\n" for r in rows)
