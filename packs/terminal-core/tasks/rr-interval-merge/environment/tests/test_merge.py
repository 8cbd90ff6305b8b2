import copy

from intervals.merge import merge, total_length


def test_disjoint():
    assert merge([[1, 2], [5, 6]]) == [[1, 2], [5, 6]]


def test_empty():
    assert merge([]) == []


def test_nested():
    assert merge([[1, 10], [2, 3], [4, 5]]) == [[1, 10]]


def test_total_length():
    assert total_length([[1, 2], [5, 6]]) == 4


def test_unsorted_input():
    assert merge([[8, 9], [1, 4], [2, 5]]) == [[1, 5], [8, 9]]


def test_touching_intervals_merge():
    assert merge([[1, 3], [3, 5]]) == [[1, 5]]


def test_input_not_mutated():
    data = [[1, 4], [2, 6], [10, 12]]
    before = copy.deepcopy(data)
    merge(data)
    assert data == before
