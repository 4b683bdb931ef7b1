"""Record kinds (SPEC 2): what a record's bytes are read as, and the kind a shard's records are.

Every reader of records (the renderer, the schema scan, ``verify``, the library, Ray's source and
sink) decodes through ``decode`` and chooses a shard's kind with ``choose_kind``, so a record that
does not parse is named the same way wherever it is met.
"""

from __future__ import annotations

from typing import Any, Iterable

from tfrfs.errors import TfrfsError
from tfrfs.format import proto

RECORD_KINDS = ("example", "sequence", "raw")
KIND_SAMPLE = 16   # records ``choose_kind`` looks at: indexing never reads a whole shard for it

_MESSAGES = {"example": proto.Example, "sequence": proto.SequenceExample}
_SHALLOW = {"example": proto.ShallowExample, "sequence": proto.ShallowSequenceExample}


class Unparsable(TfrfsError, ValueError):
    """A record's bytes are not a message of its shard's kind (shown as ``.bin``, SPEC 2)."""


def message_name(kind: str) -> str:
    """The message a record of ``kind`` ("example" or "sequence") is: ``Example`` or ``SequenceExample``."""
    return _MESSAGES[kind].__name__


def decode(data: bytes, kind: str, *, shallow: bool = False) -> Any:
    """The message record ``data`` of ``kind`` ("example" or "sequence") holds; ``shallow``: read
    one level deep (``proto.ShallowExample``: each feature left as its bytes).

    Raises ``Unparsable`` with the one message that says why.
    """
    cls = (_SHALLOW if shallow else _MESSAGES)[kind]
    try:
        return cls.FromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types
        raise Unparsable(problem_text(kind, exc)) from None


def problem_text(kind: str, exc: BaseException) -> str:
    """Why a record of ``kind`` did not parse, ``exc`` being what the parse raised."""
    return f"record does not parse as {message_name(kind)}: {exc or type(exc).__name__}"


def parse_problem(data: bytes, kind: str) -> str | None:
    """Why ``data`` does not parse as a record of ``kind``, or None when it does (a raw record
    always does)."""
    if kind == "raw":
        return None
    try:
        decode(data, kind)
    except Unparsable as exc:
        return exc.message
    return None


def choose_kind(records: Iterable[bytes]) -> str:
    """SPEC 2: the record kind of a shard, from its non-empty records whose checksums hold.

    Only the first ``KIND_SAMPLE`` such records are looked at. Any that parses as neither makes
    the shard raw; one with feature lists makes it sequence.
    """
    kind = "example"
    for n, data in enumerate(records):
        if n >= KIND_SAMPLE:
            break
        try:
            # Not kept: one parsed copy at a time beside the bytes (a record may be 2 GiB).
            lists = decode(data, "sequence").HasField("feature_lists")
        except Unparsable:
            return "raw"
        if lists:
            kind = "sequence"
        elif parse_problem(data, "example"):
            return "raw"
    return kind
