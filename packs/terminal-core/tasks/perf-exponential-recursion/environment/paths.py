"""Count the monotone paths through a grid.

Usage: python3 paths.py GRID_FILE
GRID_FILE has one row per line, `.` for an open cell and `#` for a wall. A path starts at the
top-left cell, ends at the bottom-right cell, moves only right or down and never enters a
wall. Prints the number of such paths (0 if either corner is a wall).
"""
import sys


def count(grid, r, c):
    if r >= len(grid) or c >= len(grid[0]) or grid[r][c] == "#":
        return 0
    if r == len(grid) - 1 and c == len(grid[0]) - 1:
        return 1
    return count(grid, r + 1, c) + count(grid, r, c + 1)


def main():
    with open(sys.argv[1]) as fh:
        grid = [line.rstrip("\n") for line in fh if line.strip()]
    print(count(grid, 0, 0))


if __name__ == "__main__":
    main()
