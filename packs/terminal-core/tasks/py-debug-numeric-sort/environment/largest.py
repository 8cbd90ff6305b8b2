"""Print the N largest entries of a listing with lines `<size-in-bytes><TAB><path>`.

Usage: python3 largest.py LISTING [-n N]     (N defaults to 3)
Output: `<size> <path>` lines, largest first; equal sizes are ordered by path.
"""
import argparse


def read_listing(path):
    entries = []
    with open(path) as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                continue
            size, name = line.split("\t", 1)
            entries.append((size, name))
    return entries


def largest(entries, n):
    ordered = sorted(entries, key=lambda e: (e[0], e[1]), reverse=True)
    return ordered[:n]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("listing")
    parser.add_argument("-n", type=int, default=3)
    args = parser.parse_args()
    for size, name in largest(read_listing(args.listing), args.n):
        print(size, name)


if __name__ == "__main__":
    main()
