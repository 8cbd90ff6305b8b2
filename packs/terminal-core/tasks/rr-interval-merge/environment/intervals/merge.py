"""Merge closed integer intervals.

merge(intervals) takes a list of [start, end] pairs (start <= end, in any order) and returns
a new list of disjoint [start, end] pairs, sorted by start, covering exactly the same
integers. Intervals that overlap or touch (share an endpoint, like [1, 3] and [3, 5]) become
one. The input list and its pairs are never modified.
"""


def merge(intervals):
    out = []
    for iv in intervals:
        if out and iv[0] < out[-1][1]:
            out[-1][1] = max(out[-1][1], iv[1])
        else:
            out.append(iv)
    return out


def total_length(intervals):
    """How many integers the intervals cover."""
    return sum(end - start + 1 for start, end in merge(intervals))
