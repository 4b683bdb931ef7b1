"""A large value staged through a stand-in (``tfrfs.edit.largevalue``): the record staged is byte for byte
the one ``SerializeToString(deterministic=True)`` gives with the value in place, and the digest of
its feature is the one ``pins`` computes, whatever the record's shape and the value's size."""

from __future__ import annotations

import io
import os
import re
import tempfile
from typing import Any, Iterator

import pytest
from hypothesis import given, settings, strategies as st

from tfrfs.edit import largevalue
from tfrfs.format import proto
from tfrfs.edit.feature_files import _judged_whole
from tfrfs.errors import Invalid
from tfrfs.edit.mutate import Target, apply
from tfrfs.view.pins import feature_digest


def _none(key: str, section: str) -> tuple[str | None, bool]:
    return None, False


@pytest.fixture(scope="module")
def value_file() -> Iterator[Any]:
    """A temporary file, given new content by each call: (its descriptor)."""
    with tempfile.TemporaryFile() as f:
        fd = f.fileno()

        def fill(data: bytes) -> int:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            return fd
        yield fill


def _record(kind: str, n_other: int) -> Any:
    if kind == "sequence":
        msg = proto.SequenceExample()
        for i in range(n_other):
            msg.context.feature[f"c{i}"].int64_list.value.append(i)
            steps = msg.feature_lists.feature_list[f"s{i}"].feature
            steps.add().bytes_list.value.extend([b"a" * (i * 50), b"b"])
            steps.add().bytes_list.value.append(b"c")
        return msg
    msg = proto.Example()
    for i in range(n_other):
        msg.features.feature[f"k{i}"].bytes_list.value.append(b"x" * (i * 70))
    msg.features.feature["z"].float_list.value.append(0.5)
    return msg


def _staged(spliced: largevalue.Spliced, content: bytes) -> bytes:
    out = io.BytesIO()
    spliced.write_to(out, "")   # BytesIO has no descriptor: the piece-by-piece copy
    return out.getvalue()


TARGETS = {
    "example": [Target("", "blob", ".bin"), Target("", "k1", ".jpg"), Target("", "label", ".txt"),
                Target("", "imgs", ".bin", item=1), Target("", "imgs", ".bin", item=0, insert=True)],
    "sequence": [Target("context", "blob", ".bin"), Target("context", "c0", ".txt"),   # c0: int64, refused
                 Target("feature_lists", "s1", ".bin", item=0), Target("feature_lists", "s2", ".txt", item=3),
                 Target("feature_lists", "new", ".bin", item=0)],
}


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(["example", "sequence"]), n_other=st.integers(0, 4), which=st.integers(0, 4),
       size=st.one_of(st.integers(largevalue._HEAD + largevalue._TAIL, 400),
                      st.sampled_from([127, 128, 16383, 16384, 16385, 70000])),
       end=st.sampled_from([b"", b"\n", b"\n\n", b"x\n"]))
def test_the_staged_record_is_the_one_serialized_with_the_value(value_file: Any, kind: str, n_other: int,
                                                                 which: int, size: int, end: bytes) -> None:
    target = TARGETS[kind][which]
    content = (bytes(range(256)) * (size // 256 + 1))[:size - len(end)] + end
    if kind == "example" and target.item is not None:
        base = _record(kind, n_other)
        base.features.feature["imgs"].bytes_list.value.extend([b"one", b"two"])
    else:
        base = _record(kind, n_other)
    real, stood = type(base)(), type(base)()
    real.CopyFrom(base)
    stood.CopyFrom(base)
    stand = largevalue.stand_in(value_file(content), len(content))
    try:
        apply(real, target, content, _none)
    except Invalid as exc:
        # Refused for what the name and the kind say: the stand-in is refused alike.
        with pytest.raises(Invalid, match=re.escape(str(exc))):
            apply(stood, target, stand.data, _none)
        return
    apply(stood, target, stand.data, _none)
    spliced = stand.splice(stood.SerializeToString(deterministic=True))
    want = real.SerializeToString(deterministic=True)
    assert len(spliced) == len(want)
    assert _staged(spliced, content) == want
    assert spliced.head + content[:spliced.length] + spliced.tail == want
    # The feature's digest, as a pin keeps it.
    feats = stood.feature_lists.feature_list if target.section == "feature_lists" else (
        stood.context.feature if target.section == "context" else stood.features.feature)
    digest = stand.splice(feats[target.key].SerializeToString(deterministic=True)).blake2b(16)
    assert digest == feature_digest(real, target.section, target.key)


def test_copied_by_the_kernel_into_a_journal_file(value_file: Any, tmp_path: Any) -> None:
    content = os.urandom(3 << 20)
    stand = largevalue.stand_in(value_file(content), len(content))
    msg = proto.Example()
    msg.features.feature["a"].int64_list.value.append(7)
    msg.features.feature["blob"].bytes_list.value.append(stand.data)
    spliced = stand.splice(msg.SerializeToString(deterministic=True))
    with open(tmp_path / "edit", "wb") as f:
        spliced.write_to(f, tmp_path / "edit")
    got = proto.Example.FromString((tmp_path / "edit").read_bytes())
    assert got.features.feature["blob"].bytes_list.value[0] == content
    assert list(got.features.feature["a"].int64_list.value) == [7]
    assert spliced.prefixed(b"name").head == b"name" + spliced.head


def test_a_stand_in_that_is_not_a_whole_value_is_refused(value_file: Any) -> None:
    content = os.urandom(1000)
    stand = largevalue.stand_in(value_file(content), len(content))
    msg = proto.Example()
    msg.features.feature["blob"].bytes_list.value.append(b"before" + stand.data)
    with pytest.raises(ValueError):
        stand.splice(msg.SerializeToString(deterministic=True))
    with pytest.raises(ValueError):
        stand.splice(b"no stand-in here")


@pytest.mark.parametrize("target,raw_in_dataset,whole", [
    (Target("", "blob", ".json"), False, True),                     # JSON
    (Target("feature_lists", "s1", ".txt"), False, True),           # a feature list's own file is JSON
    (Target("", "new", ".png"), True, True),                        # a key the dataset shows as raw pixels
    (Target("", "k0", ".png", raw=True), False, True),
    (Target("", "new", ".png"), False, False),
    (Target("", "imgs", ".png", item=0), True, False),              # items are never pixels
    (Target("feature_lists", "s1", ".png", item=0), True, False),
    *[(t, True, False) for ts in TARGETS.values() for t in ts if t.suffix != ".png"],
])
def test_content_judged_whole_never_gets_a_stand_in(target: Target, raw_in_dataset: bool, whole: bool) -> None:
    msg = _record("sequence" if target.section else "example", 2)
    kinds = lambda key, section: (None, raw_in_dataset)   # noqa: E731
    assert _judged_whole(msg, target, kinds, decode_raw=True) is whole
    assert _judged_whole(msg, target, kinds, decode_raw=False) is (whole and target.suffix != ".png")
