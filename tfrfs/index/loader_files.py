"""Record-index text files of the common TFRecord loaders.

NVIDIA DALI's ``tfrecord2idx`` script (``tools/tfrecord2idx``) and the ``tfrecord``
package's ``tfrecord.tools.tfrecord2idx.create_index`` write the same text: one line
per record, ``OFFSET LENGTH\\n`` in plain decimal, OFFSET being where the record's
8-byte length header starts and LENGTH the whole framed record (8 + 4 + data + 4).
The separator is one space, every line (the last too) ends with a newline, and an
empty shard gives an empty file. Both write through a Python text-mode file, so on
Windows the lines end with ``\\r\\n``; :func:`parse` accepts that, and a last line
without newline. DALI's script has no default index name; the tfrecord package's
directory mode writes STEM.tfindex (see :func:`candidate_names`).

tfrfs keeps a shard's index as the header offset of every record plus the end of
the last one; :func:`format_lines` and :func:`parse` convert between that and the
text. Only canonical text is accepted (no signs, leading zeros, extra blanks or
empty lines), so whatever :func:`parse` accepts, :func:`format_lines` writes back
byte for byte (``\\r\\n`` and a missing final newline aside).

What the index cannot show: the tools write a line for a last record that is cut
short too, with the length that was left in the file, so such a line ends exactly
at the file size like a whole record. Nor does the index show that the shard was
rewritten with the same size. Whoever trusts an index should compare a record's
header with its LENGTH (LENGTH - 16 == the declared data length) before use.
Byte identity with the tools holds for intact shards: for a cut shard tfrfs's
offsets stop at the last whole record, while the tools add a line for the cut one.
"""

from __future__ import annotations

import itertools
import json
import operator
import os
import re
from array import array
from typing import NoReturn, Sequence

# Tried beside a shard named NAME: NAME + suffix, and for the usual TFRecord
# extensions also the name with that extension replaced (see candidate_names).
CANDIDATE_SUFFIXES = (".idx", ".tfindex", ".index")

# Extensions that the tfrecord package's naming (stem + ".tfindex", its README's
# "{}.tfrecord" beside "{}.index") may replace. Other "extensions" are not, because
# the stem would not name one shard: "mnist-test.tfrecord-00000-of-00001" has the
# stem "mnist-test" in common with every shard of its split, and the stem of
# "train.tfrecord.gz" is the name of its uncompressed sibling.
_REPLACEABLE_EXTENSIONS = (".tfrecord", ".tfrecords", ".record", ".records")

MIN_RECORD = 16   # a framed record with no data: u64 length, two u32 checksums

_LINE = b"%d %d\n"
_FORMAT_CHUNK = 1 << 14          # records formatted per bytes-% call
_PARSE_CHUNK = 1 << 17           # bytes of text parsed per json.loads call
_DIGITS = b"0123456789"
_TEXT_BYTES = _DIGITS + b" \n"
_SEPARATORS_TO_COMMAS = bytes.maketrans(b" \n", b",,")
_CANONICAL_LINE = re.compile(rb"(0|[1-9][0-9]*) (0|[1-9][0-9]*)")
_MAX_DIGITS = 20                 # 2**64 has 20 digits; nothing longer can fit a shard


class LoaderIndexError(ValueError):
    """The text is not a loader record index, or not one of this shard."""


def candidate_names(shard_name: str) -> list[str]:
    """Names a loader's index of the shard ``shard_name`` (a base name) may have, best first.

    First NAME.idx (DALI's documentation names the index of ``train-00001-of-01024``
    ``train-00001-of-01024.idx``), NAME.tfindex and NAME.index; then, when NAME ends in
    a TFRecord extension, that extension replaced: STEM.tfindex (what the tfrecord
    package's ``create_indices`` writes), STEM.index (its README) and STEM.idx.
    """
    names = [shard_name + suffix for suffix in CANDIDATE_SUFFIXES]
    stem, ext = os.path.splitext(shard_name)
    if ext.lower() in _REPLACEABLE_EXTENSIONS:
        names += [stem + suffix for suffix in (".tfindex", ".index", ".idx")]
    return names


def _as_list(values: Sequence[int]) -> list[int]:
    return values.tolist() if isinstance(values, array) else list(values)


def format_lines(offsets: Sequence[int]) -> bytes:
    """The loaders' index text for a shard whose records start at ``offsets[:-1]`` and whose
    last record ends at ``offsets[-1]`` (``[0]`` for an empty shard, giving ``b""``)."""
    count = len(offsets) - 1
    if count < 0:
        raise ValueError("offsets must end with the end of the last record (0 for an empty shard)")
    if offsets[0] != 0:
        raise ValueError(f"the first record must start at 0, not {offsets[0]}")
    parts = []
    for start in range(0, count, _FORMAT_CHUNK):
        stop = min(start + _FORMAT_CHUNK, count)
        heads = _as_list(offsets[start:stop + 1])
        lengths = list(map(operator.sub, heads[1:], heads[:-1]))
        if min(lengths) < MIN_RECORD:
            i = next(i for i, n in enumerate(lengths) if n < MIN_RECORD)
            raise ValueError(f"record {start + i} at offset {heads[i]} would be {lengths[i]} bytes long; "
                             f"a framed record has at least {MIN_RECORD}")
        pairs = [0] * (2 * len(lengths))
        pairs[0::2] = heads[:-1]
        pairs[1::2] = lengths
        parts.append(_LINE * len(lengths) % tuple(pairs))
    return b"".join(parts)


def parse(data: bytes, *, stream_size: int) -> array[int]:
    """The offsets (tfrfs's form, as :func:`format_lines` takes them) of a loader's index text
    for a shard of ``stream_size`` bytes; :class:`LoaderIndexError` says what does not fit.

    The records must follow each other from offset 0 with no gap or overlap, each at
    least 16 bytes long, and the last must end exactly at ``stream_size``. Messages
    name the line ("line 3: ...") but not the file, which the caller knows.
    """
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    if data and not data.endswith(b"\n"):
        data += b"\n"
    out = array("Q", [0])
    end = 0
    line = 1      # number of the first line of the chunk
    pos = 0
    while pos < len(data):
        cut = data.find(b"\n", pos + _PARSE_CHUNK)
        cut = len(data) if cut < 0 else cut + 1
        chunk = data[pos:cut]
        values = _numbers(chunk)
        if values is None:
            _syntax_error(chunk, line)
        heads, lengths = values[0::2], values[1::2]
        if min(lengths) < MIN_RECORD:
            i = next(i for i, n in enumerate(lengths) if n < MIN_RECORD)
            raise LoaderIndexError(f"line {line + i}: length {lengths[i]} is less than {MIN_RECORD}, "
                                   f"the size of a TFRecord record with no data")
        ends = list(itertools.accumulate(lengths, initial=end))
        if ends[:-1] != heads:
            i = next(i for i, (h, e) in enumerate(zip(heads, ends)) if h != e)
            if line + i == 1:
                raise LoaderIndexError(f"line 1: the first record starts at {heads[i]}, not at 0")
            raise LoaderIndexError(f"line {line + i}: record starts at {heads[i]}, but the one before "
                                   f"ends at {ends[i]} (records follow each other with no gap)")
        if ends[-1] > stream_size:
            i = next(i for i, e in enumerate(ends[1:]) if e > stream_size)
            raise LoaderIndexError(f"line {line + i}: record ends at {ends[i + 1]}, past the end of "
                                   f"the shard ({stream_size} bytes)")
        out.extend(ends[1:])
        end = ends[-1]
        line += len(lengths)
        pos = cut
    if end != stream_size:
        if len(out) == 1:
            raise LoaderIndexError(f"the index lists no records, but the shard has {stream_size} bytes")
        raise LoaderIndexError(f"the {len(out) - 1} records listed end at {end}, but the shard has "
                               f"{stream_size} bytes")
    return out


def _numbers(chunk: bytes) -> list[int] | None:
    """The numbers of whole canonical lines, two a line, or None if any line is not one.

    Only digits, spaces and newlines, the separators alternating space and newline,
    and then JSON's integer syntax (no empty numbers, no leading zeros) for the numbers.
    """
    if chunk.translate(None, _TEXT_BYTES):
        return None
    lines = chunk.count(b"\n")
    if chunk.translate(None, _DIGITS) != b" \n" * lines:
        return None
    body = chunk.translate(_SEPARATORS_TO_COMMAS)
    try:
        values = json.loads(b"[" + body[:-1] + b"]")
    except ValueError:
        return None
    if len(values) != 2 * lines:
        return None
    return values


def _syntax_error(chunk: bytes, first_line: int) -> NoReturn:
    """Raise for the first line of ``chunk`` that is not ``OFFSET LENGTH``."""
    for n, text in enumerate(chunk.split(b"\n")[:-1], first_line):
        match = _CANONICAL_LINE.fullmatch(text)
        if match is None:
            raise LoaderIndexError(f"line {n}: {_shown(text)} is not OFFSET LENGTH "
                                   f"(two decimal numbers, one space between)")
        if max(len(match[1]), len(match[2])) > _MAX_DIGITS:
            raise LoaderIndexError(f"line {n}: a number of more than {_MAX_DIGITS} digits")
    raise LoaderIndexError(f"lines {first_line} on are not OFFSET LENGTH lines")


def _shown(text: bytes, limit: int = 60) -> str:
    shown = repr(text[:limit])
    return shown + "..." if len(text) > limit else shown
