"""Loader record-index files (DALI's tfrecord2idx, the tfrecord package's create_index)."""

from __future__ import annotations

import importlib.util
import io
from array import array
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REALDATA
from tfrfs.index import loader_files as loaderidx
from tfrfs.format import salvage
from tfrfs.format import tfrecord
from tfrfs.index.loader_files import LoaderIndexError


def shard_bytes(records: list[bytes]) -> bytes:
    buf = io.BytesIO()
    w = tfrecord.StreamWriter(buf)
    for r in records:
        w.write(r)
    w.close()
    return buf.getvalue()


def offsets_of(shard: bytes) -> array:
    walk = salvage.Walk(lambda size, off: shard[off:off + size], len(shard))
    offsets = array("Q", (offset for offset, _, _ in walk))
    assert not walk.problems
    offsets.append(walk.end)
    return offsets


# Records of 0, 3 and 1000 data bytes: framed 16, 19 and 1016 bytes long.
RECORDS = [b"", b"abc", b"x" * 1000]
SHARD = shard_bytes(RECORDS)
OFFSETS = array("Q", [0, 16, 35, 1051])
# Written out by hand from the format: "OFFSET LENGTH\n" per record.
EXPECTED = b"0 16\n16 19\n35 1016\n"


def test_offsets_of_the_sample_shard() -> None:
    assert len(SHARD) == 1051
    assert offsets_of(SHARD) == OFFSETS


def test_format_lines_writes_the_tools_text() -> None:
    assert loaderidx.format_lines(OFFSETS) == EXPECTED
    assert loaderidx.format_lines(list(OFFSETS)) == EXPECTED
    assert loaderidx.format_lines([0, 16]) == b"0 16\n"


def test_format_lines_large_numbers_and_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loaderidx, "_FORMAT_CHUNK", 2)
    big = 5 * 10**12
    assert loaderidx.format_lines([0, 16, big, big + 17, big + 40, big + 57]) == (
        b"0 16\n16 4999999999984\n5000000000000 17\n5000000000017 23\n5000000000040 17\n")


def test_empty_shard() -> None:
    assert loaderidx.format_lines(array("Q", [0])) == b""
    assert loaderidx.parse(b"", stream_size=0) == array("Q", [0])
    with pytest.raises(LoaderIndexError, match="lists no records, but the shard has 16 bytes"):
        loaderidx.parse(b"", stream_size=16)
    with pytest.raises(LoaderIndexError, match="past the end of the shard"):
        loaderidx.parse(b"0 16\n", stream_size=0)


@pytest.mark.parametrize("offsets, message", [
    ([], "end of the last record"),
    ([8, 24], "first record must start at 0"),
    ([0, 16, 31], "record 1 at offset 16 would be 15 bytes long"),
    ([0, 16, 16], "would be 0 bytes"),
    ([0, 32, 20], "would be -12 bytes"),
])
def test_format_lines_refuses_what_no_shard_has(offsets: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loaderidx.format_lines(offsets)


def test_parse_reads_the_tools_text() -> None:
    got = loaderidx.parse(EXPECTED, stream_size=len(SHARD))
    assert isinstance(got, array) and got.typecode == "Q"
    assert got == OFFSETS


@pytest.mark.parametrize("text", [
    b"0 16\n16 19\n35 1016",              # last line without newline
    b"0 16\r\n16 19\r\n35 1016\r\n",      # written in text mode on Windows
    b"0 16\r\n16 19\r\n35 1016",
])
def test_parse_accepts_crlf_and_a_missing_final_newline(text: bytes) -> None:
    assert loaderidx.parse(text, stream_size=len(SHARD)) == OFFSETS


@pytest.mark.parametrize("text, message", [
    # not OFFSET LENGTH lines
    (b"0\t16\n16 19\n35 1016\n", r"line 1: b'0\\t16' is not OFFSET LENGTH"),
    (b"0  16\n16 19\n35 1016\n", "line 1: "),
    (b" 0 16\n16 19\n35 1016\n", "line 1: "),
    (b"0 16 \n16 19\n35 1016\n", "line 1: "),
    (b"0 16\n16 19\n\n35 1016\n", "line 3: b'' is not OFFSET LENGTH"),
    (b"0 16\n16 19\n35 1016\n\n", "line 4: b'' is not"),
    (b"\n", "line 1: "),
    (b"0 16\n16 19 35\n1016\n", "line 2: b'16 19 35'"),
    (b"0 16\n16\n19 35 1016\n", "line 2: b'16'"),
    (b"0 16\n16 +19\n35 1016\n", "line 2: "),
    (b"0 16\n16 -19\n35 1016\n", "line 2: "),
    (b"0 16\n16 1_9\n35 1016\n", "line 2: "),
    (b"0 16\n16 019\n35 1016\n", "line 2: b'16 019'"),
    (b"00 16\n16 19\n35 1016\n", "line 1: "),
    (b"0 16\n16 0x13\n35 1016\n", "line 2: "),
    (b"0 16\n16 19.0\n35 1016\n", "line 2: "),
    (b"0 16\n16 1e3\n35 1016\n", "line 2: "),
    (b"0 16\n16 19\n35 \xd9\xa1\xd9\xa0\n", "line 3: "),      # Arabic-Indic digits
    (b"0 16\n16 19\r35 1016\n", "line 2: "),                  # a lone CR
    (b"0 16\n16 19\n35 1016\r", "line 3: "),
    (b"\xef\xbb\xbf0 16\n16 19\n35 1016\n", "line 1: "),     # a byte-order mark
    (b"0,16\n16,19\n35,1016\n", "line 1: "),
    (b"[0, 16]\n", "line 1: "),
    (b"0 16\n16 19\n35 " + b"9" * 5000 + b"\n", "line 3: "),
    # lines, but not this shard's records
    (b"16 19\n35 1016\n", "line 1: the first record starts at 16, not at 0"),
    (b"0 16\n17 18\n35 1016\n", "line 2: record starts at 17, but the one before ends at 16"),
    (b"0 16\n15 20\n35 1016\n", "line 2: record starts at 15, but the one before ends at 16"),
    (b"0 16\n16 19\n0 16\n", "line 3: record starts at 0"),
    (b"0 16\n16 19\n35 1015\n", "the 3 records listed end at 1050, but the shard has 1051 bytes"),
    (b"0 16\n16 19\n", "the 2 records listed end at 35, but the shard has 1051 bytes"),
    (b"0 16\n16 19\n35 1017\n", "line 3: record ends at 1052, past the end of the shard \\(1051 bytes\\)"),
    (b"0 16\n16 19\n35 1016\n1051 16\n", "line 4: record ends at 1067, past the end"),
    (b"0 16\n16 19\n35 " + b"9" * 20 + b"\n", "line 3: record ends at 100000000000000000034, past"),
    (b"0 16\n16 15\n31 1020\n", "line 2: length 15 is less than 16"),
    (b"0 16\n16 0\n16 1035\n", "line 2: length 0 is less than 16"),
])
def test_parse_rejects(text: bytes, message: str) -> None:
    with pytest.raises(LoaderIndexError, match=message):
        loaderidx.parse(text, stream_size=len(SHARD))


def test_rejections_are_value_errors() -> None:
    assert issubclass(LoaderIndexError, ValueError)


def test_parse_names_the_right_line_past_the_first_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loaderidx, "_PARSE_CHUNK", 8)
    offsets = array("Q", range(0, 16 * 101, 16))
    text = loaderidx.format_lines(offsets)
    assert loaderidx.parse(text, stream_size=16 * 100) == offsets
    bad = text.replace(b"\n800 16\n", b"\n800 016\n")
    with pytest.raises(LoaderIndexError, match="line 51: b'800 016'"):
        loaderidx.parse(bad, stream_size=16 * 100)
    gap = text.replace(b"\n800 16\n816 16\n", b"\n800 16\n817 16\n")
    with pytest.raises(LoaderIndexError, match="line 52: record starts at 817"):
        loaderidx.parse(gap, stream_size=16 * 100)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5000), max_size=60))
def test_round_trip(data_sizes: list[int]) -> None:
    shard = shard_bytes([b"\x07" * n for n in data_sizes])
    offsets = offsets_of(shard)
    text = loaderidx.format_lines(offsets)
    assert text.count(b"\n") == len(data_sizes)
    assert loaderidx.parse(text, stream_size=len(shard)) == offsets
    assert loaderidx.format_lines(loaderidx.parse(text.replace(b"\n", b"\r\n"), stream_size=len(shard))) == text


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_parse_accepts_only_text_it_writes_back(data: st.DataObject) -> None:
    """Whatever parse accepts, format_lines writes back byte for byte; everything else is a
    LoaderIndexError (never another exception)."""
    text = bytearray(EXPECTED)
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(text)))
        piece = data.draw(st.sampled_from([b"0", b"1", b"6", b"9", b" ", b"\n", b"\r", b"\t", b"+", b"-",
                                           b"_", b"x", b"e", b".", b"\r\n", b""]))
        cut = data.draw(st.integers(0, 2))
        text[pos:pos + cut] = piece
    size = data.draw(st.sampled_from([len(SHARD), 1035, 1050, 1052, 0, 16]))
    try:
        got = loaderidx.parse(bytes(text), stream_size=size)
    except LoaderIndexError:
        return
    canonical = bytes(text).replace(b"\r\n", b"\n")
    if canonical and not canonical.endswith(b"\n"):
        canonical += b"\n"
    assert loaderidx.format_lines(got) == canonical
    assert got[-1] == size


def test_candidate_names() -> None:
    assert loaderidx.CANDIDATE_SUFFIXES == (".idx", ".tfindex", ".index")
    assert loaderidx.candidate_names("train.tfrecord") == [
        "train.tfrecord.idx", "train.tfrecord.tfindex", "train.tfrecord.index",
        "train.tfindex", "train.index", "train.idx"]
    # DALI's own examples: shards without an extension, the index is NAME.idx
    assert loaderidx.candidate_names("train-00001-of-01024") == [
        "train-00001-of-01024.idx", "train-00001-of-01024.tfindex", "train-00001-of-01024.index"]
    assert loaderidx.candidate_names("data.tfrecords")[3:] == ["data.tfindex", "data.index", "data.idx"]
    assert loaderidx.candidate_names("test.record")[3:] == ["test.tfindex", "test.index", "test.idx"]
    # A stem shared by every shard of a split, or the name of the uncompressed sibling:
    # no replaced-extension names.
    assert loaderidx.candidate_names("mnist-test.tfrecord-00000-of-00001") == [
        "mnist-test.tfrecord-00000-of-00001.idx", "mnist-test.tfrecord-00000-of-00001.tfindex",
        "mnist-test.tfrecord-00000-of-00001.index"]
    assert loaderidx.candidate_names("train.tfrecord.gz") == [
        "train.tfrecord.gz.idx", "train.tfrecord.gz.tfindex", "train.tfrecord.gz.index"]
    assert loaderidx.candidate_names(".tfrecord") == [".tfrecord.idx", ".tfrecord.tfindex", ".tfrecord.index"]


REAL_SHARDS = [
    "tfrecord_lite/tests/test.tfrecord",                 # 42 records
    "TensorFlow-Demo/data/train.tfrecords",              # 891 records
    "notebook-benchmarks/tensorflow_datasets/mnist/3.0.1/mnist-test.tfrecord-00000-of-00001",  # 10000
]


def _real_shard(rel: str) -> Path:
    path = REALDATA / rel
    if not path.is_file():
        pytest.skip(f"no real data at {path}")
    return path


@pytest.mark.parametrize("rel", REAL_SHARDS)
def test_real_shard_round_trip(rel: str) -> None:
    shard = _real_shard(rel).read_bytes()
    offsets = offsets_of(shard)
    text = loaderidx.format_lines(offsets)
    assert text.count(b"\n") == len(offsets) - 1
    assert loaderidx.parse(text, stream_size=len(shard)) == offsets


def tfrecord_create_index() -> Callable[[str, str], None]:
    """The tfrecord package's ``create_index``, skipping where the package is not installed.

    Its module file is loaded alone (it needs only the standard library): importing
    ``tfrecord.tools.tfrecord2idx`` runs the package's ``__init__``, which imports numpy and
    registers its own copy of TensorFlow's example.proto in protobuf's default pool; in a
    process that has imported TensorFlow (as other unit tests do) that fails with
    "TypeError: Couldn't build proto file into descriptor pool: duplicate symbol
    'tensorflow.BytesList'".
    """
    package = importlib.util.find_spec("tfrecord")
    if package is None or not package.submodule_search_locations:
        pytest.skip("the tfrecord package is not installed")
    path = Path(list(package.submodule_search_locations)[0]) / "tools" / "tfrecord2idx.py"
    spec = importlib.util.spec_from_file_location("_tfrecord_package_tfrecord2idx", path)
    if not path.is_file() or spec is None or spec.loader is None:
        pytest.skip(f"the tfrecord package has no {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.create_index


def test_byte_identical_to_the_tfrecord_package(tmp_path: Path) -> None:
    create_index = tfrecord_create_index()
    shards = {"sample.tfrecord": SHARD, "empty.tfrecord": b"",
              "many.tfrecord": shard_bytes([bytes(range(n % 256)) for n in range(0, 3000, 7)])}
    for rel in REAL_SHARDS:
        path = REALDATA / rel
        if path.is_file():
            shards[path.name] = path.read_bytes()
    for name, shard in shards.items():
        shard_path = tmp_path / name
        shard_path.write_bytes(shard)
        index_path = tmp_path / (name + ".idx")
        create_index(str(shard_path), str(index_path))
        written = index_path.read_bytes()
        assert loaderidx.format_lines(offsets_of(shard)) == written, name
        assert loaderidx.parse(written, stream_size=len(shard)) == offsets_of(shard), name
    assert (tmp_path / "sample.tfrecord.idx").read_bytes() == EXPECTED
    assert (tmp_path / "empty.tfrecord.idx").read_bytes() == b""


def test_the_tools_index_of_a_cut_shard(tmp_path: Path) -> None:
    """What the index alone cannot show: for a last record cut short the tools write the length
    that was left, so the line still ends at the file size; parse accepts it when 16 bytes or
    more are left, and only the record's header (declaring 1000 data bytes) tells."""
    create_index = tfrecord_create_index()
    cut = SHARD[:-10]
    (tmp_path / "cut").write_bytes(cut)
    create_index(str(tmp_path / "cut"), str(tmp_path / "cut.idx"))
    written = (tmp_path / "cut.idx").read_bytes()
    assert written == b"0 16\n16 19\n35 1006\n"
    assert loaderidx.parse(written, stream_size=len(cut)) == array("Q", [0, 16, 35, 1041])
    # only the 8-byte length left of the last record: a 8-byte "record", refused
    short = SHARD[:35 + 8]
    (tmp_path / "short").write_bytes(short)
    create_index(str(tmp_path / "short"), str(tmp_path / "short.idx"))
    assert (tmp_path / "short.idx").read_bytes() == b"0 16\n16 19\n35 8\n"
    with pytest.raises(LoaderIndexError, match="line 3: length 8 is less than 16"):
        loaderidx.parse((tmp_path / "short.idx").read_bytes(), stream_size=len(short))
