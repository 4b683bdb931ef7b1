"""Changes to a record message (``tfrfs.edit.mutate``), without a disk or a mount: what content written
to a feature file does to the record (SPEC 7), checked on the message protobuf itself."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tfrfs.format import proto
from tfrfs.errors import Invalid
from tfrfs.edit.mutate import Target, apply, item_count, remove
from tfrfs.view.nodes import Loc


def _none(key: str, section: str) -> tuple[str | None, bool]:
    return None, False


def _known(kinds: dict[str, tuple[str | None, bool]]):
    return lambda key, section: kinds.get(key, (None, False))


def _example(**features) -> proto.Example:
    msg = proto.Example()
    for key, (kind, values) in features.items():
        getattr(msg.features.feature[key], kind).value.extend(values)
    return msg


def test_a_known_key_keeps_its_kind_and_a_new_one_takes_it_from_the_content() -> None:
    msg = _example(x=("float_list", [1.5]))
    apply(msg, Target("", "x", ".json"), b"[1, 2]\n", _none)
    assert msg.features.feature["x"].WhichOneof("kind") == "float_list"
    assert list(msg.features.feature["x"].float_list.value) == [1.0, 2.0]
    apply(msg, Target("", "n", ".json"), b"[1, 2]\n", _none)
    assert list(msg.features.feature["n"].int64_list.value) == [1, 2]
    apply(msg, Target("", "y", ".json"), b"[]\n", _known({"y": ("float_list", False)}))
    assert msg.features.feature["y"].WhichOneof("kind") == "float_list"   # the dataset's kind


def test_content_that_does_not_fit_is_refused() -> None:
    msg = _example(n=("int64_list", [1]))
    with pytest.raises(Invalid):
        apply(msg, Target("", "n", ".json"), b'["a"]\n', _none)
    with pytest.raises(Invalid):
        apply(msg, Target("", "n", ".json"), b"[1,\n", _none)


def test_items_of_a_list_are_replaced_inserted_and_removed_one_at_a_time() -> None:
    msg = _example(items=("bytes_list", [b"a", b"b", b"c"]))
    apply(msg, Target("", "items", ".bin", item=1), b"B", _none)
    assert list(msg.features.feature["items"].bytes_list.value) == [b"a", b"B", b"c"]
    apply(msg, Target("", "items", ".bin", item=1, insert=True), b"new", _none)
    assert list(msg.features.feature["items"].bytes_list.value) == [b"a", b"new", b"B", b"c"]
    assert remove(msg, Loc("", "items", 0)) == "item"
    assert list(msg.features.feature["items"].bytes_list.value) == [b"new", b"B", b"c"]
    assert item_count(msg, "", "items") == 3
    with pytest.raises(Invalid):
        apply(_example(n=("int64_list", [1])), Target("", "n", ".bin", item=0), b"x", _none)


def test_removing_the_last_item_removes_the_feature() -> None:
    msg = _example(items=("bytes_list", [b"a"]), other=("int64_list", [1]))
    assert remove(msg, Loc("", "items", 0)) == "feature"
    assert "items" not in msg.features.feature
    assert remove(msg, Loc("", "other")) == "feature"
    assert not msg.features.feature


def test_a_png_for_raw_pixels_is_stored_as_pixels_and_sets_the_shape() -> None:
    msg = _example(image_raw=("bytes_list", [bytes(6)]), height=("int64_list", [2]), width=("int64_list", [3]))
    buf = io.BytesIO()
    Image.new("RGB", (4, 5), (1, 2, 3)).save(buf, format="PNG")
    apply(msg, Target("", "image_raw", ".png", raw=True), buf.getvalue(), _none)
    f = msg.features.feature
    assert list(f["height"].int64_list.value) == [5] and list(f["width"].int64_list.value) == [4]
    assert "depth" not in f and "channels" not in f       # missing ones are not made
    assert f["image_raw"].bytes_list.value[0] == bytes([1, 2, 3]) * 20


def test_steps_of_a_feature_list() -> None:
    msg = proto.SequenceExample()
    flist = msg.feature_lists.feature_list["n"]
    for i in range(3):
        flist.feature.add().int64_list.value.append(i)
    apply(msg, Target("feature_lists", "n", ".json", item=1), b"[10]\n", _none)
    apply(msg, Target("feature_lists", "n", ".json", item=0, insert=True), b"[-1]\n", _none)
    assert [list(f.int64_list.value) for f in flist.feature] == [[-1], [0], [10], [2]]
    assert remove(msg, Loc("feature_lists", "n", 2)) == "item"
    assert [list(f.int64_list.value) for f in flist.feature] == [[-1], [0], [2]]
    apply(msg, Target("feature_lists", "n", ".json"), b"[[1, 2], []]\n", _none)
    assert [list(f.int64_list.value) for f in flist.feature] == [[1, 2], []]
    assert item_count(msg, "feature_lists", "n") == 2


def test_text_written_with_one_trailing_newline() -> None:
    """SPEC 7 "Text": the newline echo adds goes when the value replaced has none, or for a value
    new to the record when no value of the key in the dataset ends in one."""
    msg = _example(t=("bytes_list", [b"dog"]), nl=("bytes_list", [b"line\n"]),
                   items=("bytes_list", [b"a", b"b\n", b"\0c"]))
    no_newline = lambda key, section: False      # noqa: E731
    with_newline = lambda key, section: key == "known"   # noqa: E731
    apply(msg, Target("", "t", ".txt"), b"cat\n", _none, dataset_newline=with_newline)
    apply(msg, Target("", "nl", ".txt"), b"next\n", _none, dataset_newline=no_newline)
    apply(msg, Target("", "new", ".txt"), b"new\n", _none, dataset_newline=no_newline)
    apply(msg, Target("", "known", ".txt"), b"known\n", _none, dataset_newline=with_newline)
    apply(msg, Target("", "raw", ".bin"), b"bin\n", _none)            # only .txt
    apply(msg, Target("", "p", ".txt"), b"printf", _none)
    f = msg.features.feature
    assert [f[k].bytes_list.value[0] for k in ("t", "nl", "new", "known", "raw", "p")] == \
        [b"cat", b"next\n", b"new", b"known\n", b"bin\n", b"printf"]
    # In a .list/ folder, item by item: against the item replaced, or the key for a new one.
    apply(msg, Target("", "items", ".txt", item=0), b"A\n", _none, dataset_newline=no_newline)
    apply(msg, Target("", "items", ".txt", item=1), b"B\n", _none, dataset_newline=no_newline)
    apply(msg, Target("", "items", ".txt", item=3), b"D\n", _none, dataset_newline=no_newline)
    assert list(f["items"].bytes_list.value) == [b"A", b"B\n", b"\0c", b"D"]


def test_text_steps_written_with_one_trailing_newline() -> None:
    msg = proto.SequenceExample()
    flist = msg.feature_lists.feature_list["w"]
    flist.feature.add().bytes_list.value.append(b"\0x")
    flist.feature.add().bytes_list.value.append(b"y\n")
    apply(msg, Target("feature_lists", "w", ".txt", item=0), b"X\n", _none)
    apply(msg, Target("feature_lists", "w", ".txt", item=1), b"Y\n", _none)
    apply(msg, Target("feature_lists", "w", ".txt", item=2), b"Z\n", _none,
          dataset_newline=lambda key, section: section == "feature_lists")
    assert [f.bytes_list.value[0] for f in flist.feature] == [b"X", b"Y\n", b"Z\n"]
