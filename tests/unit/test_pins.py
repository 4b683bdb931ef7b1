"""Names kept stable until a commit (``tfrfs.view.pins``) and how the renderer honours them: pure
functions of messages and pins, no disk, no mount.

The expected names are written out by hand from SPEC 3.1/3.2/3.3 and README's "Names inside a
record stay stable too", not computed with the code under test.
"""

from __future__ import annotations

import io

from PIL import Image

from tfrfs.format import proto
from tfrfs.view.nodes import DataFile, Dir
from tfrfs.view.pins import NamePin, Shown, apply_pinned_paths, feature_digest, pin_from_shown, value_digest
from tfrfs.view.render import Options, render

EXAMPLE = Options("example", True, 0, report_shown=True)
SEQUENCE = Options("sequence", True, 0, report_shown=True)


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2), (200, 10, 10)).save(buf, format="JPEG")
    return buf.getvalue()


JPG = _jpeg()


def _listing(d: Dir, prefix: str = "") -> list[str]:
    out = []
    for name, child in d.children.items():
        path = prefix + name
        if isinstance(child, Dir):
            out.append(path + "/")
            out += _listing(child, path + "/")
        else:
            out.append(path)
    return sorted(out)


def _pin(msg, options: Options = EXAMPLE) -> NamePin:
    """The pin a change starts from: the record as it is shown now."""
    return pin_from_shown(render(msg.SerializeToString(), options).shown, msg)


def test_apply_pinned_paths_moves_only_where_nothing_clashes() -> None:
    layout = {"a": ("a.json",), "b": ("b.json",), "c": ("x", "c.json")}
    paths, moved = apply_pinned_paths(layout, {"a": ("old.json",), "b": ("x",), "c": ("x", "c.json")})
    # a goes back to its old name; b cannot take "x" (a folder of c's); c is where it was.
    assert dict(paths) == {"a": ("old.json",), "b": ("b.json",), "c": ("x", "c.json")}
    assert moved == {"a"}


def test_apply_pinned_paths_leaves_the_layout_alone_when_nothing_moves() -> None:
    layout = {"a": ("a.json",)}
    paths, moved = apply_pinned_paths(layout, {"a": ("a.json",)})
    assert paths is layout and moved == set()


def test_a_pin_holds_only_while_the_value_is_the_one_it_was_taken_for() -> None:
    msg = proto.Example()
    msg.features.feature["k"].int64_list.value.append(1)
    pin = NamePin({("", "k"): Shown((), "k", digest=value_digest(msg.features.feature["k"]))})
    assert list(pin.unchanged("", msg.features.feature)) == ["k"]
    msg.features.feature["k"].int64_list.value.append(2)
    assert pin.unchanged("", msg.features.feature) == {}
    assert feature_digest(msg, "", "k") == value_digest(msg.features.feature["k"])
    assert feature_digest(msg, "", "missing") == b""


def test_list_items_keep_their_numbers_after_one_is_removed() -> None:
    msg = proto.Example()
    msg.features.feature["items"].bytes_list.value.extend([JPG, b"\x00a", b"\x00b"])
    pin = _pin(msg)
    assert pin.get("", "items").item_names == ("0", "1", "2")
    del msg.features.feature["items"].bytes_list.value[0]
    pin.drop_item_name("", "items", 0, feature_digest(msg, "", "items"))
    view = render(msg.SerializeToString(), EXAMPLE, pin=pin)
    assert _listing(view.root) == ["items.list/", "items.list/1.bin", "items.list/2.bin"]
    assert view.pin is not None and view.pin.get("", "items").item_names == ("1", "2")
    # Without the pin, the rules renumber.
    assert _listing(render(msg.SerializeToString(), EXAMPLE).root) == \
        ["items.list/", "items.list/0.bin", "items.list/1.bin"]


def test_a_list_left_with_one_value_stays_a_folder() -> None:
    msg = proto.Example()
    msg.features.feature["items"].bytes_list.value.extend([b"\x00a", b"\x00b"])
    pin = _pin(msg)
    del msg.features.feature["items"].bytes_list.value[1]
    pin.drop_item_name("", "items", 1, feature_digest(msg, "", "items"))
    assert _listing(render(msg.SerializeToString(), EXAMPLE, pin=pin).root) == ["items.list/", "items.list/0.bin"]
    assert _listing(render(msg.SerializeToString(), EXAMPLE).root) == ["items.bin"]


def test_raw_pixels_keep_their_png_when_their_height_goes() -> None:
    msg = proto.Example()
    f = msg.features.feature
    f["image_raw"].bytes_list.value.append(bytes(range(6)))
    f["height"].int64_list.value.append(2)
    f["width"].int64_list.value.append(3)
    pin = _pin(msg)
    before = render(msg.SerializeToString(), EXAMPLE).root.children["image_raw.png"]
    del f["height"]
    view = render(msg.SerializeToString(), EXAMPLE, pin=pin)
    png = view.root.children["image_raw.png"]
    assert isinstance(png, DataFile) and isinstance(before, DataFile) and png.data == before.data
    assert _listing(render(msg.SerializeToString(), EXAMPLE).root) == ["image_raw.bin", "width.json"]


def test_a_pin_that_changes_nothing_is_dropped() -> None:
    msg = proto.Example()
    msg.features.feature["k"].int64_list.value.append(1)
    view = render(msg.SerializeToString(), EXAMPLE, pin=_pin(msg))
    assert view.pin is None


def test_steps_keep_their_numbers_and_their_folder() -> None:
    msg = proto.SequenceExample()
    msg.context.SetInParent()
    steps = msg.feature_lists.feature_list["jpeg"]
    for _ in range(3):
        steps.feature.add().bytes_list.value.append(JPG)
    pin = _pin(msg, SEQUENCE)
    del steps.feature[1]
    pin.drop_item_name("feature_lists", "jpeg", 1, feature_digest(msg, "feature_lists", "jpeg"))
    root = render(msg.SerializeToString(), SEQUENCE, pin=pin).root
    assert _listing(root) == ["context/", "feature_lists/", "feature_lists/jpeg.steps/",
                              "feature_lists/jpeg.steps/0.jpg", "feature_lists/jpeg.steps/2.jpg"]


def test_an_unparsable_record_renders_empty_with_the_reason() -> None:
    view = render(b"\xff\xff\xff", EXAMPLE)
    assert view.root.children == {} and view.failure is not None and "does not parse as Example" in view.failure


def test_the_name_a_value_was_written_through_finds_it_until_it_changes() -> None:
    msg = proto.Example()
    msg.features.feature["img/x"].bytes_list.value.append(b"")
    msg.features.feature["n"].int64_list.value.append(1)
    pin = _pin(msg)
    pin.keep_written("", "img/x", ("img",), "x.bin", feature_digest(msg, "", "img/x"))
    view = render(msg.SerializeToString(), EXAMPLE, pin=pin)
    # Listed by the rules (an empty value is text), found by the name it was written through too.
    assert _listing(view.root) == ["img/", "img/x.txt", "n.json"]
    folder = view.root.children["img"]
    assert isinstance(folder, Dir) and folder.aliases == {"x.bin": folder.children["x.txt"]}
    # The next change takes its pin from what is shown: the name holds while the value does.
    msg.features.feature["n"].int64_list.value.append(2)
    later = pin_from_shown(view.shown, msg)
    again = render(msg.SerializeToString(), EXAMPLE, pin=later).root.children["img"]
    assert isinstance(again, Dir) and list(again.aliases) == ["x.bin"]
    msg.features.feature["img/x"].bytes_list.value[0] = b"\0binary"
    changed = render(msg.SerializeToString(), EXAMPLE, pin=later).root.children["img"]
    assert isinstance(changed, Dir) and list(changed.children) == ["x.bin"] and not changed.aliases


def test_a_json_file_is_found_by_no_other_name() -> None:
    """A value written as JSON and shown as text holds other bytes than were written: no alias."""
    msg = proto.Example()
    msg.features.feature["t"].bytes_list.value.append(b"cat")
    pin = _pin(msg)
    pin.keep_written("", "t", (), "t.json", feature_digest(msg, "", "t"))
    view = render(msg.SerializeToString(), EXAMPLE, pin=pin)
    assert _listing(view.root) == ["t.txt"] and not view.root.aliases
