"""``tfrfs.ray.write``'s encoding of rows (SPEC 9), without Ray: ``raysink.table_records`` on the
Arrow tables ``tfrfs.ray.read(records="example")`` makes (``raysource._ExampleRows``, as a read
task does) gives records that parse equal to the source's, an empty list (or feature list) coming
back absent; kinds come from the columns' Arrow types, by ``codec``'s rules where a type says
nothing; the ``record`` column stays byte for byte."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfrfs
from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.ray import sink as raysink
from tfrfs.ray import source as raysource
from tfrfs.format import tfrecord
from tfrfs.errors import Invalid
from tfrfs.format.record_kinds import choose_kind

from support import example_pb

pa = pytest.importorskip("pyarrow")


# --- helpers -------------------------------------------------------------------------------------

def feature(kind: str | None, values: list | tuple = ()) -> proto.Feature:
    f = proto.Feature()
    if kind is not None:
        codec.value_to_proto(codec.Value(kind, tuple(values)), f)
    return f


def sequence(context: dict, lists: dict) -> proto.SequenceExample:
    se = proto.SequenceExample()
    se.context.SetInParent()
    se.feature_lists.SetInParent()
    for k, f in context.items():
        se.context.feature[k].CopyFrom(f)
    for k, steps in lists.items():
        fl = se.feature_lists.feature_list[k]
        for s in steps:
            fl.feature.add().CopyFrom(s)
    return se


def example(feats: dict) -> proto.Example:
    ex = proto.Example()
    ex.features.SetInParent()
    for k, f in feats.items():
        ex.features.feature[k].CopyFrom(f)
    return ex


def example_rows(folder: Path, records: list[bytes]) -> pa.Table:
    """The ``example`` rows a read task gives for a shard of ``records``."""
    path = folder / "s.tfrecord"
    path.write_bytes(b"".join(tfrecord.frame(r) for r in records))
    with tfrfs.open(str(path), cache_dir=str(folder / "cache")) as ds:
        columns = raysource.columns_of(ds)
        shard = ds.shards[0]
        rows = raysource._ExampleRows(pa, columns)
        part = raysource.Part(shard.path, str(path), "NONE", "", 0, shard.kind, None)  # type: ignore[arg-type]
        for i, data in enumerate(records):
            rows.add(part, i, data)
        return rows.table()


def without_empty(message):
    """What ``example`` rows keep of a record: its empty lists and feature lists are absent."""
    out = type(message).FromString(message.SerializeToString())
    feats = out.context.feature if isinstance(out, proto.SequenceExample) else out.features.feature
    for k in [k for k, f in feats.items() if f.WhichOneof("kind") and not codec.value_from_proto(f).values]:
        del feats[k]
    if isinstance(out, proto.SequenceExample):
        lists = out.feature_lists.feature_list
        for k in [k for k, fl in lists.items() if not fl.feature]:
            del lists[k]
    return out


def round_trip(folder: Path, messages: list, batch_rows: int = raysink.BATCH_ROWS) -> list[bytes]:
    source = [m.SerializeToString(deterministic=True) for m in messages]
    written = list(raysink.table_records(example_rows(folder, source), batch_rows))
    # What was written is read with the test suite's own message classes (support/example_pb.py).
    ours = example_pb.SequenceExample if isinstance(messages[0], proto.SequenceExample) else example_pb.Example
    assert len(written) == len(source)
    for n, (m, data) in enumerate(zip(messages, written)):
        want = without_empty(m)
        assert ours.FromString(data) == example_pb.same(want), n
        if want == m:   # nothing dropped: the same bytes (the source was serialized deterministically)
            assert data == source[n], n
    return written


def parsed(table: pa.Table, cls=proto.Example) -> list:
    return [codec.plain_values(cls.FromString(r)) for r in raysink.table_records(table)]


# --- round trips through read's rows -------------------------------------------------------------

def test_sequence_examples_come_back(tmp_path: Path) -> None:
    messages = []
    for i in range(20):
        ctx = {"label": feature("int64_list", [i] if i != 3 else []),      # 3: an empty context list
               "name": feature("bytes_list", [f"seq-{i}".encode(), b"\x80\x00"])}
        if i % 4 == 1:
            ctx["note"] = feature(None)                                      # a Feature with no kind
        lists = {"frames": [feature("float_list", [i + j / 4, 0.1] if j != 1 else []) for j in range(i % 5)],
                 "tokens": [feature("int64_list", [i, -(2 ** 63)]) for _ in range(i % 3)]}
        if i == 6:
            lists["marks"] = [feature(None), feature(None)]                  # steps with no kind
        messages.append(sequence(ctx, lists))
    written = round_trip(tmp_path, messages, batch_rows=7)
    assert choose_kind(written) == "sequence"
    # An empty step keeps its kind: a step is never dropped.
    step = example_pb.SequenceExample.FromString(written[2]).feature_lists.feature_list["frames"].feature[1]
    assert step.WhichOneof("kind") == "float_list" and not step.float_list.value


def test_examples_come_back(tmp_path: Path) -> None:
    messages = []
    for i in range(20):
        feats = {"id": feature("int64_list", [i] if i != 6 else []), "blob": feature("bytes_list", [bytes([0x80, i])])}
        if i % 4 == 1:
            feats["note"] = feature(None)
        elif i % 4 == 2:
            feats["note"] = feature("bytes_list", [b"x" * i])
        if i in (0, 13):
            feats["void"] = feature(None)                                   # never a kind: list<null>
        if i % 3 == 0:
            feats["mixed"] = feature("int64_list", [i, -i] if i != 9 else [])   # two kinds: a struct column
        elif i % 3 == 1:
            feats["mixed"] = feature("float_list", [i + 0.25])
        elif i == 5:
            feats["mixed"] = feature(None)
        messages.append(example(feats))
    table = example_rows(tmp_path, [m.SerializeToString() for m in messages])
    assert pa.types.is_struct(table.schema.field("mixed").type)
    assert str(table.schema.field("void").type) == "list<item: null>"
    round_trip(tmp_path, messages, batch_rows=3)


_VALUES = {
    "int64_list": st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=3),
    "float_list": st.lists(st.floats(width=32, allow_nan=False), max_size=3),
    "bytes_list": st.lists(st.binary(max_size=4), max_size=3),
}
_KIND = st.sampled_from(["int64_list", "float_list", "bytes_list", None])


@st.composite
def features(draw) -> proto.Feature:
    kind = draw(_KIND)
    return feature(kind, draw(_VALUES[kind]) if kind else [])


@st.composite
def datasets(draw) -> list:
    """A few Examples, or SequenceExamples whose feature lists each hold one kind of step."""
    feats = st.dictionaries(st.sampled_from(["a", "b", "c"]), features(), max_size=3)
    if not draw(st.booleans()):
        return [example(f) for f in draw(st.lists(feats, min_size=1, max_size=5))]
    kinds = {k: draw(_KIND) for k in ("x", "y")}

    def steps(kind):
        return st.lists(_VALUES[kind].map(lambda v: feature(kind, v)) if kind else st.just(feature(None)), max_size=3)
    lists = st.fixed_dictionaries({}, optional={k: steps(kind) for k, kind in kinds.items()})
    return [sequence(c, ls) for c, ls in draw(st.lists(st.tuples(feats, lists), min_size=1, max_size=5))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datasets())
def test_any_dataset_comes_back(messages: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        round_trip(Path(folder), messages, batch_rows=2)


# --- kinds from Arrow types ------------------------------------------------------------------------

def test_kinds_follow_the_arrow_types() -> None:
    table = pa.table({
        "f64": pa.array([[0.1, 2.0]], pa.list_(pa.float64())),        # rounded to float32
        "text": pa.array([["é", "b"]], pa.list_(pa.string())),         # UTF-8
        "flags": pa.array([[True, False]], pa.list_(pa.bool_())),      # 0/1
        "u32": pa.array([[4294967295]], pa.list_(pa.uint32())),
        "one": pa.array([7], pa.int64()),                             # a scalar column: one value
        "big": pa.array([[1.0]], pa.large_list(pa.float32())),
        "dict": pa.array([["a"]], pa.list_(pa.dictionary(pa.int8(), pa.string()))),
    })
    (row,) = parsed(table)
    assert row == {"f64": [codec._f32_tuple([0.1])[0], 2.0], "text": ["é".encode(), b"b"], "flags": [1, 0],
                   "u32": [4294967295], "one": [7], "big": [1.0], "dict": [b"a"]}


def test_a_struct_of_kinds_gives_the_record_its_kind() -> None:
    t = pa.struct([("int64_list", pa.list_(pa.int64())), ("float_list", pa.list_(pa.float32()))])
    cells = [{"int64_list": [1], "float_list": None}, {"int64_list": None, "float_list": [2.5]},
             {"int64_list": [], "float_list": None},       # as read gives a key the record lacks
             {"int64_list": None, "float_list": None}, None]   # a Feature with no kind
    rows = parsed(pa.table({"k": pa.array(cells, t)}))
    assert rows == [{"k": [1]}, {"k": [2.5]}, {}, {"k": None}, {"k": None}]
    with pytest.raises(Invalid, match="row 0 of its block: column 'k': the fields int64_list and float_list"):
        parsed(pa.table({"k": pa.array([{"int64_list": [1], "float_list": [2.0]}], t)}))


def test_typed_empty_steps_keep_their_kind_and_empty_lists_are_absent() -> None:
    lists_type = pa.struct([("ints", pa.list_(pa.list_(pa.int64()))), ("none", pa.list_(pa.list_(pa.null())))])
    table = pa.table({
        "empty": pa.array([[], []], pa.list_(pa.int64())),
        "kindless": pa.array([None, []], pa.list_(pa.float32())),
        "feature_lists": pa.array([{"ints": [[], [1]], "none": [None]}, {"ints": [], "none": None}], lists_type),
    })
    first, second = [example_pb.SequenceExample.FromString(r) for r in raysink.table_records(table)]
    assert list(first.context.feature) == ["kindless"] and first.context.feature["kindless"].WhichOneof("kind") is None
    ints = first.feature_lists.feature_list["ints"].feature
    assert [s.WhichOneof("kind") for s in ints] == ["int64_list", "int64_list"] and list(ints[1].int64_list.value) == [1]
    assert [s.WhichOneof("kind") for s in first.feature_lists.feature_list["none"].feature] == [None]
    # Nothing at all but still a SequenceExample: its shard is indexed as one.
    assert second.HasField("feature_lists") and not second.feature_lists.feature_list and not second.context.feature
    assert choose_kind([second.SerializeToString()]) == "sequence"


def test_untyped_columns_are_inferred_by_codec_rules() -> None:
    table = pa.table({"nothing": pa.array([[], None], pa.list_(pa.null())),
                      "nulls": pa.array([None, None], pa.null())})
    assert parsed(table) == [{"nulls": None}, {"nothing": None, "nulls": None}]
    # Python dicts of steps (no Arrow types): one kind inferred for a whole feature list (SPEC 7).
    lists = raysink._lists_converter(pa, pa.null())({"x": [[1], [2.5]], "y": [["a"], []]})
    assert lists == {"x": [codec.Value("float_list", (1.0,)), codec.Value("float_list", (2.5,))],
                     "y": [codec.Value("bytes_list", (b"a",)), codec.Value("bytes_list", ())]}
    np = pytest.importorskip("numpy")
    assert raysink._inferred(np.array([[1, 2], [3, 4]], np.int32)) == codec.Value("int64_list", (1, 2, 3, 4))


def test_values_that_do_not_fit_name_the_row_and_column() -> None:
    table = pa.table({"shard": ["a.tfrecord"] * 2, "index": [4, 5],
                      "x": pa.array([[1.0], [1e39]], pa.list_(pa.float64()))})
    with pytest.raises(Invalid, match=r"a.tfrecord record 5: column 'x': 1e\+39 is too large for float32"):
        list(raysink.table_records(table))
    with pytest.raises(Invalid, match="outside the int64 range"):
        list(raysink.table_records(pa.table({"x": pa.array([[2 ** 64 - 1]], pa.list_(pa.uint64()))})))
    lists = pa.struct([("x", pa.list_(pa.list_(pa.int64()))), ("y", pa.list_(pa.list_(pa.uint64())))])
    with pytest.raises(Invalid, match="row 0 of its block: feature list 'y': step 1: 18446744073709551615 is outside"):
        list(raysink.table_records(pa.table({"feature_lists": pa.array([{"x": [[1]], "y": [[1], [2 ** 64 - 1]]}],
                                                                     lists)})))
    with pytest.raises(Invalid, match="a list cannot be a feature value"):
        list(raysink.table_records(pa.table({"x": pa.array([[[1]]], pa.list_(pa.list_(pa.int64())))})))


def test_the_record_column_is_written_byte_for_byte() -> None:
    data = [b"", b"\x00\xff raw", b"x" * 10]
    table = pa.table({"shard": ["s"] * 3, "index": [0, 1, 2], "record": pa.array(data, pa.binary())})
    assert list(raysink.table_records(table, batch_rows=2)) == data
    with pytest.raises(TypeError, match="the record column holds str, not bytes"):
        list(raysink.table_records(pa.table({"record": ["text"]})))
    # A feature named ``record`` (as read gives it: a list column) is a feature, not the bytes.
    assert parsed(pa.table({"record": pa.array([[1]], pa.list_(pa.int64()))})) == [{"record": [1]}]


def test_big_rows_are_taken_a_few_at_a_time(monkeypatch) -> None:
    big = [bytes([i]) * 1000 for i in range(10)]
    table = pa.table({"blob": pa.array([[b] for b in big], pa.list_(pa.binary()))})
    assert raysink._rows_per_batch(table, raysink.BATCH_ROWS) == raysink.BATCH_ROWS
    monkeypatch.setattr(raysink, "BATCH_BYTES", 2500)
    assert raysink._rows_per_batch(table, raysink.BATCH_ROWS) == 2
    assert parsed(table) == [{"blob": [b]} for b in big]   # in order, none lost at a batch's edge
    monkeypatch.setattr(raysink, "BATCH_BYTES", 10)
    assert raysink._rows_per_batch(table, raysink.BATCH_ROWS) == 1


# --- codec.plain_to_value ----------------------------------------------------------------------------

def test_plain_to_value() -> None:
    v = codec.plain_to_value
    assert v(None) == codec.Value("none", ())
    assert v([1, 2]) == codec.Value("int64_list", (1, 2))
    assert v([1, 2.5]) == codec.Value("float_list", (1.0, 2.5))
    assert v(["é", b"\x80"]) == codec.Value("bytes_list", ("é".encode(), b"\x80"))
    assert v([]) == codec.Value("bytes_list", ())          # SPEC 7: [] of a new key
    assert v([], "int64_list") == codec.Value("int64_list", ())
    assert v([0.1], "float_list").values == codec._f32_tuple([0.1])
    assert v([3], "float_list") == codec.Value("float_list", (3.0,))
    for bad, kind, reason in (([True], None, "boolean"), (["a", 1], None, "mixes strings and numbers"),
                              ([1.5], "int64_list", "not an integer"), ([2 ** 63], "int64_list", "int64 range"),
                              ([1e39], "float_list", "too large for float32"), ([1], "bytes_list", "not bytes"),
                              ("ab", None, "not a list"), ([None], None, "cannot be a feature value")):
        with pytest.raises(Invalid, match=reason):
            v(bad, kind)
