import csv
import io

from csvlite.writer import format_row, write_rows

ROWS = [
    ["plain", 'a "quoted" word', "comma, inside", "multi\nline", "", None, 3],
    ['"', ",", "\r\n", "ok"],
]


def test_roundtrip_with_csv_module():
    text = write_rows(ROWS)
    back = list(csv.reader(io.StringIO(text, newline="")))
    want = [["" if v is None else str(v) for v in row] for row in ROWS]
    assert back == want
    assert format_row(["no quotes needed"]) == "no quotes needed"
