"""Unit and property tests of tfrfs.format.wire: finding an Example's features in its bytes.

What the module finds must agree with protobuf's own parse whenever it finds anything; when
the encoding is not the usual one it must say so (None), never guess.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tfrfs.format import proto
from tfrfs.format import wire

floats32 = st.floats(width=32, allow_nan=False)
feature_values = st.one_of(
    st.tuples(st.just("bytes_list"), st.lists(st.binary(max_size=40), max_size=4)),
    st.tuples(st.just("int64_list"), st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=4)),
    st.tuples(st.just("float_list"), st.lists(floats32, max_size=4)),
    st.tuples(st.just("none"), st.just([])),
)
examples = st.dictionaries(st.text(max_size=12), feature_values, max_size=6)


def make_example(features: dict) -> proto.Example:
    ex = proto.Example()
    for key, (kind, values) in features.items():
        feat = ex.features.feature[key]
        if kind != "none":
            lst = getattr(feat, kind)
            lst.SetInParent()
            lst.value.extend(values)
    return ex


def parsed(data: bytes) -> proto.Example | None:
    try:
        return proto.Example.FromString(data)
    except Exception:  # noqa: BLE001 - any protobuf decode error
        return None


@given(examples)
@settings(max_examples=300)
def test_spans_of_a_serialized_example_parse_to_its_features(features):
    ex = make_example(features)
    data = ex.SerializeToString()
    spans = wire.feature_spans(data)
    assert spans is not None
    assert set(spans) == set(features)
    for key, (start, end) in spans.items():
        assert proto.Feature.FromString(data[start:end]) == ex.features.feature[key]


@given(examples, st.data())
@settings(max_examples=400)
def test_changed_bytes_agree_with_protobuf_or_give_none(features, draw):
    """Whatever the bytes, a result is protobuf's own: same keys, and each span parses to the
    feature protobuf gives that key; a record protobuf rejects has a span that fails too."""
    data = bytearray(make_example(features).SerializeToString())
    for _ in range(draw.draw(st.integers(1, 3))):
        how = draw.draw(st.sampled_from(["flip", "insert", "cut", "append"]))
        at = draw.draw(st.integers(0, len(data)))
        if how == "flip" and at < len(data):
            data[at] ^= 1 << draw.draw(st.integers(0, 7))
        elif how == "insert":
            data[at:at] = draw.draw(st.binary(min_size=1, max_size=3))
        elif how == "cut":
            del data[at:at + draw.draw(st.integers(1, 3))]
        else:
            data += make_example(draw.draw(examples)).SerializeToString()
    data = bytes(data)
    spans = wire.feature_spans(data)
    if spans is None:
        return
    whole = parsed(data)
    parts = {}
    for key, (start, end) in spans.items():
        try:
            parts[key] = proto.Feature.FromString(data[start:end])
        except Exception:  # noqa: BLE001
            parts[key] = None
    if whole is None:
        assert None in parts.values()
    else:
        assert set(spans) == set(whole.features.feature)
        assert all(parts[k] == whole.features.feature[k] for k in spans)


def test_usual_forms_and_unusual_ones():
    one = make_example({"a": ("bytes_list", [b"x" * 300]), "n": ("int64_list", [1])}).SerializeToString()
    other = make_example({"a": ("bytes_list", [b"y"])}).SerializeToString()
    assert wire.feature_spans(b"") == {}
    assert set(wire.feature_spans(one)) == {"a", "n"}
    assert wire.feature_spans(one + other) is None             # `features` twice: protobuf merges
    assert wire.feature_spans(one + b"\x28\x07") is None       # an unknown field after it
    entries = one[3:]                                          # 0x0A, a 2-byte length, the entries
    assert one[:3] == b"\x0a" + bytes([len(entries) & 0x7F | 0x80, len(entries) >> 7])
    twice = entries + entries
    assert wire.feature_spans(b"\x0a" + bytes([len(twice) & 0x7F | 0x80, len(twice) >> 7]) + twice) is None
    bad_key = b"\x0a\x08\x0a\x06\x0a\x02\xff\xfe\x12\x00"     # key bytes are not UTF-8
    assert parsed(bad_key) is None and wire.feature_spans(bad_key) is None
    assert wire.feature_spans(one[:-1]) is None                 # cut short


@given(feature_values)
def test_single_bytes_value(value):
    kind, values = value
    feat = make_example({"k": value}).features.feature["k"]
    data = b"pad" + feat.SerializeToString()
    got = wire.single_bytes_value(data, 3, len(data))
    if kind == "bytes_list" and len(values) == 1:
        assert got is not None and data[got[0]:got[1]] == values[0]
    else:
        assert got is None


def test_single_bytes_value_wants_one_kind_only():
    feat = proto.Feature()
    feat.bytes_list.value.append(b"\xff\xd8\xff" + b"j" * 100)
    data = feat.SerializeToString()
    assert wire.single_bytes_value(data, 0, len(data)) is not None
    ints = proto.Feature()
    ints.int64_list.value.append(5)
    both = data + ints.SerializeToString()      # two kinds: protobuf keeps the last
    assert proto.Feature.FromString(both).WhichOneof("kind") == "int64_list"
    assert wire.single_bytes_value(both, 0, len(both)) is None
