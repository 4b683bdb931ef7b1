"""What ``tfrfs reshard`` writes where, decided on the driver before any byte is copied: the
global order of the records (shards in order, records in order; or one deterministic shuffle of
it), where it is cut into new shards, and the new shards' names.

The shuffle (``--shuffle SEED``) is a keyed permutation of ``[0, N)``: a balanced Feistel network
over the smallest even power of two that holds N (so a domain under 4N), walked again while it
lands past N (cycle walking: at most a few steps on average). Output position ``i`` takes the
record at ``permutation(i)`` in the global order. It needs no memory per record (a billion
records are shuffled with six 64-bit keys), the same SEED gives the same order on every machine
and Python, and every record appears exactly once.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from typing import Sequence

from tfrfs.errors import UsageError

_M64 = (1 << 64) - 1
ROUNDS = 6


class Permutation:
    """A keyed permutation of ``range(n)``: ``p(i)`` for ``i`` in ``range(n)`` is every number of
    ``range(n)`` once."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        bits = max(2, (max(n - 1, 1)).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        digest = hashlib.sha256(f"tfrfs-shuffle:{seed}".encode()).digest()
        self.keys = [int.from_bytes(digest[4 * k:4 * k + 8], "little") for k in range(ROUNDS)]

    def _round(self, right: int, key: int) -> int:
        # splitmix64's finalizer over (half, key): a strong 64-bit mix, cut to the half's width.
        x = (right * 0x9E3779B97F4A7C15 + key) & _M64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        return (x ^ (x >> 31)) & self.mask

    def _encrypt(self, x: int) -> int:
        left, right, half, mask = x >> self.half, x & self.mask, self.half, self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return ((left & mask) << half) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._encrypt(i)
        while x >= self.n:   # cycle walking: stays within [0, n) and stays a permutation
            x = self._encrypt(x)
        return x


def cut_by_count(total: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` ranges ``[start, stop)`` over ``total`` records, of equal counts (the first ones
    one longer when it does not divide)."""
    base, extra = divmod(total, shards)
    out, start = [], 0
    for k in range(shards):
        stop = start + base + (1 if k < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def cut_by_size(shard_offsets: Sequence[Sequence[int]], limit: int) -> list[tuple[int, int]]:
    """Ranges of global record numbers over shards of these record offsets (each: every record's
    start, then the end of the last), in order: a new shard starts where the next record would take
    the current one past ``limit`` framed bytes (a shard holds at least one record). One bisection
    per cut, not a step per record."""
    out: list[tuple[int, int]] = []
    start = used = base = 0
    for offsets in shard_offsets:
        count = len(offsets) - 1
        r = 0
        while r < count:
            k = max(r, bisect.bisect_right(offsets, offsets[r] + (limit - used), r, count + 1) - 1)
            if k == r:
                if used == 0:
                    k = r + 1          # one record larger than the limit: a shard of its own
                else:
                    out.append((start, base + r))
                    start, used = base + r, 0
                    continue
            used += offsets[k] - offsets[r]
            r = k
        base += count
    if base > start or not out:
        out.append((start, base))
    return out


class Order:
    """The global order of a dataset's records: shard after shard, record after record."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.starts = [0]
        for c in counts:
            self.starts.append(self.starts[-1] + c)

    @property
    def total(self) -> int:
        return self.starts[-1]

    def locate(self, g: int) -> tuple[int, int]:
        """(shard number, record number) of global record ``g``."""
        s = bisect.bisect_right(self.starts, g) - 1
        return s, g - self.starts[s]


# --- names ------------------------------------------------------------------------------------

_DIGITS = 5
_FIELD = re.compile(r"\{([A-Z_]+)\}")
PLAIN_TEMPLATE = "{PREFIX}-{SHARD_X_OF_Y}.tfrecord"
NUMBERED = ("SHARD_INDEX", "SHARD_X_OF_Y")


def check_template(template: str, fields: Sequence[str]) -> None:
    """Raises UsageError when ``template`` names unknown fields, a folder, or no shard number."""
    named = set(_FIELD.findall(template))
    unknown = named - set(fields) - {"SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y"}
    if unknown:
        raise UsageError(f"--name {template}: unknown field(s) {', '.join(sorted(unknown))}; use "
                         f"{', '.join('{' + f + '}' for f in [*fields, 'SHARD_INDEX', 'NUM_SHARDS', 'SHARD_X_OF_Y'])}")
    if not named & set(NUMBERED):
        raise UsageError(f"--name {template}: give {{SHARD_INDEX}} or {{SHARD_X_OF_Y}}, so each shard has its own name")
    if "/" in template or template.startswith("."):
        raise UsageError(f"--name {template}: a file name, not a path or a hidden name")


def shard_name(template: str, i: int, n: int, fixed: dict[str, str]) -> str:
    """Shard ``i``'s name of ``n`` (numbers of at least five digits, as TFDS writes them)."""
    width = max(len(str(n)), _DIGITS)
    x, y = f"{i:0{width}d}", f"{n:0{width}d}"
    values = {**fixed, "SHARD_INDEX": x, "NUM_SHARDS": y, "SHARD_X_OF_Y": f"{x}-of-{y}"}
    return _FIELD.sub(lambda m: values[m.group(1)], template)


_NUMBERING = re.compile(r"(?:-\d+-of-\d+|[-_.]?\d+)\Z")
_SUFFIX = re.compile(r"(?:\.(?:tfrecords?|tfrec|records?)(?:-\d+(?:-of-\d+)?)?)?(?:\.gz|\.gzip|\.zlib)?\Z")


def stem(name: str) -> str:
    """A shard name less its TFRecord suffix and its shard numbering: ``train-00003-of-00010.tfrecord``
    and ``train.tfrecord-00003`` give ``train``."""
    base = _SUFFIX.sub("", name, count=1)
    return _NUMBERING.sub("", base, count=1)


def prefix_of(shard_names: Sequence[str], dest_name: str) -> str:
    """PREFIX of the new names: the source shards' common stem, else DEST's name."""
    stems = {stem(n) for n in shard_names}
    if len(stems) == 1 and (only := stems.pop()) and not only.startswith("."):
        return only
    return dest_name.strip(".") or "shard"
