#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "paths.py"
s = open(p).read()
start = s.index("def count(grid, r, c):")
end = s.index("def main():")
s = s[:start] + '''def count(grid, r, c):
    """Paths from (r, c) to the bottom-right corner, by dynamic programming from the end."""
    h, w = len(grid), len(grid[0])
    ways = [[0] * (w + 1) for _ in range(h + 1)]
    for i in range(h - 1, -1, -1):
        for j in range(w - 1, -1, -1):
            if grid[i][j] == "#":
                ways[i][j] = 0
            elif i == h - 1 and j == w - 1:
                ways[i][j] = 1
            else:
                ways[i][j] = ways[i + 1][j] + ways[i][j + 1]
    return ways[r][c]


''' + s[end:]
open(p, "w").write(s)
PY
python3 -B paths.py grid_small.txt
