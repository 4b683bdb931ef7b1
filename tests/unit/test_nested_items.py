"""Items inside a step's own ``N.list/`` folder (SPEC 4: a step of several values not all text is
shown like a feature value, inside ``KEY.steps/``), without a mount: what each file stands for,
what a change to one value does to the message, and which names stay until a commit.

The expected names are written out by hand from SPEC 3.2/4 and README's "Names inside a record stay
stable too", not computed with the code under test.
"""

from __future__ import annotations

import pytest

from tfrfs.format import proto
from tfrfs.errors import Invalid
from tfrfs.edit.mutate import Target, apply, put, remove, take
from tfrfs.view.nodes import DataFile, Dir, Loc
from tfrfs.view.pins import NamePin, feature_digest, pin_from_shown
from tfrfs.view.render import Options, render

SEQUENCE = Options("sequence", True, 0, report_shown=True)
EXAMPLE = Options("example", True, 0, report_shown=True)
J = [b"\xff\xd8\xff" + bytes([n]) for n in range(8)]     # JPEG by its magic bytes


def _none(key: str, section: str) -> tuple[str | None, bool]:
    return None, False


def _clip(steps: list[list[bytes]]) -> proto.SequenceExample:
    msg = proto.SequenceExample()
    msg.context.SetInParent()
    for values in steps:
        msg.feature_lists.feature_list["jpeg"].feature.add().bytes_list.value.extend(values)
    return msg


def _steps(msg: proto.SequenceExample, key: str = "jpeg") -> list[list[bytes]]:
    return [list(f.bytes_list.value) for f in msg.feature_lists.feature_list[key].feature]


def _pin(msg, options: Options = SEQUENCE) -> NamePin:
    return pin_from_shown(render(msg.SerializeToString(), options).shown, msg)


def _files(d: Dir, prefix: str = "") -> dict[str, Loc | None]:
    out: dict[str, Loc | None] = {}
    for name, child in d.children.items():
        if isinstance(child, Dir):
            out.update(_files(child, prefix + name + "/"))
        elif isinstance(child, DataFile):
            out[prefix + name] = child.loc
    return out


def test_a_file_of_a_steps_list_stands_for_that_value_of_that_step() -> None:
    root = render(_clip([J[0:2], J[2:4]]).SerializeToString(), SEQUENCE).root
    assert _files(root) == {
        "feature_lists/jpeg.steps/0.list/0.jpg": Loc("feature_lists", "jpeg", 0, sub=0),
        "feature_lists/jpeg.steps/0.list/1.jpg": Loc("feature_lists", "jpeg", 0, sub=1),
        "feature_lists/jpeg.steps/1.list/0.jpg": Loc("feature_lists", "jpeg", 1, sub=0),
        "feature_lists/jpeg.steps/1.list/1.jpg": Loc("feature_lists", "jpeg", 1, sub=1)}


def test_removing_one_value_of_a_step_changes_that_step_only() -> None:
    msg = _clip([J[0:2], J[2:4], J[4:6]])
    assert remove(msg, Loc("feature_lists", "jpeg", 1, sub=0)) == "value"
    assert _steps(msg) == [J[0:2], [J[3]], J[4:6]]
    # The last value of a step takes the step with it (as the last file of a KEY.list/ its feature).
    assert remove(msg, Loc("feature_lists", "jpeg", 1, sub=0)) == "item"
    assert _steps(msg) == [J[0:2], J[4:6]]


def test_writing_a_value_of_a_steps_list() -> None:
    msg = _clip([J[0:2], J[2:4]])
    apply(msg, Target("feature_lists", "jpeg", ".jpg", 0, sub=1), J[6], _none)                 # replaced
    apply(msg, Target("feature_lists", "jpeg", ".jpg", 1, sub=1, sub_insert=True), J[7], _none)  # in before 1
    apply(msg, Target("feature_lists", "jpeg", ".bin", 2, insert=True, sub=0, sub_insert=True), b"\0", _none)
    assert _steps(msg) == [[J[0], J[6]], [J[2], J[7], J[3]], [b"\0"]]
    msg.feature_lists.feature_list["n"].feature.add().int64_list.value.append(1)
    with pytest.raises(Invalid):     # a number step has no values to write one by one
        apply(msg, Target("feature_lists", "n", ".bin", 0, sub=0), b"\0", _none)


def test_a_value_past_the_end_goes_last_and_no_empty_value_is_made_up() -> None:
    msg = proto.Example()
    msg.features.feature["items"].bytes_list.value.extend([b"a", b"b"])
    apply(msg, Target("", "items", ".bin", item=7), b"c", _none)
    assert list(msg.features.feature["items"].bytes_list.value) == [b"a", b"b", b"c"]
    seq = _clip([J[0:2]])
    apply(seq, Target("feature_lists", "jpeg", ".jpg", 5), J[5], _none)
    assert _steps(seq) == [J[0:2], [J[5]]]


def test_steps_of_other_kinds_are_written_one_by_one() -> None:
    """A .jpg step beside number steps is one bytes value; a .json step takes the number kind of
    the others when it fits, else the kind its content tells; a replaced step keeps its kind."""
    msg = proto.SequenceExample()
    flist = msg.feature_lists.feature_list["mixed"]
    flist.feature.add().float_list.value.append(0.5)
    apply(msg, Target("feature_lists", "mixed", ".jpg", 1), J[0], _none)
    apply(msg, Target("feature_lists", "mixed", ".json", 2), b"[3]\n", _none)    # beside steps of two kinds: an int
    assert [f.WhichOneof("kind") for f in flist.feature] == ["float_list", "bytes_list", "int64_list"]
    apply(msg, Target("feature_lists", "mixed", ".json", 3), b'["a", "b"]\n', _none)   # strings: text
    apply(msg, Target("feature_lists", "mixed", ".json", 0), b"[2]\n", _none)          # keeps float
    assert [f.WhichOneof("kind") for f in flist.feature] == ["float_list", "bytes_list", "int64_list", "bytes_list"]
    only_floats = proto.SequenceExample()
    only_floats.feature_lists.feature_list["f"].feature.add().float_list.value.append(0.5)
    apply(only_floats, Target("feature_lists", "f", ".json", 1), b"[1, 2]\n", _none)
    assert [f.WhichOneof("kind") for f in only_floats.feature_lists.feature_list["f"].feature] == \
        ["float_list", "float_list"]


def test_a_steps_values_keep_their_names_after_one_is_removed() -> None:
    msg = _clip([J[0:2], J[2:5]])
    pin = _pin(msg)
    assert dict(pin.get("feature_lists", "jpeg").sub_names) == {"0": ("0", "1"), "1": ("0", "1", "2")}
    loc = Loc("feature_lists", "jpeg", 1, sub=0)
    pin.drop(loc, remove(msg, loc), feature_digest(msg, "feature_lists", "jpeg"))
    loc = Loc("feature_lists", "jpeg", 0, sub=1)
    pin.drop(loc, remove(msg, loc), feature_digest(msg, "feature_lists", "jpeg"))
    view = render(msg.SerializeToString(), SEQUENCE, pin=pin)
    # Step 0 is left with one image and stays a folder; step 1's later images keep their numbers.
    assert sorted(_files(view.root)) == ["feature_lists/jpeg.steps/0.list/0.jpg", "feature_lists/jpeg.steps/1.list/1.jpg",
                                         "feature_lists/jpeg.steps/1.list/2.jpg"]
    # Without the pin, the rules renumber.
    assert sorted(_files(render(msg.SerializeToString(), SEQUENCE).root)) == \
        ["feature_lists/jpeg.steps/0.jpg", "feature_lists/jpeg.steps/1.list/0.jpg",
         "feature_lists/jpeg.steps/1.list/1.jpg"]


def test_a_step_removed_whole_leaves_the_others_their_names() -> None:
    msg = _clip([J[0:2], J[2:4], J[4:6]])
    pin = _pin(msg)
    for sub in (1, 0):
        loc = Loc("feature_lists", "jpeg", 0, sub=sub)
        pin.drop(loc, remove(msg, loc), feature_digest(msg, "feature_lists", "jpeg"))
    assert sorted(_files(render(msg.SerializeToString(), SEQUENCE, pin=pin).root)) == \
        ["feature_lists/jpeg.steps/1.list/0.jpg", "feature_lists/jpeg.steps/1.list/1.jpg",
         "feature_lists/jpeg.steps/2.list/0.jpg", "feature_lists/jpeg.steps/2.list/1.jpg"]


def test_a_value_moved_to_another_key_keeps_its_item_names() -> None:
    msg = proto.Example()
    msg.features.feature["items"].bytes_list.value.extend([J[0], b"\0a", b"\0b"])
    pin = _pin(msg, EXAMPLE)
    loc = Loc("", "items", 0)
    pin.drop(loc, remove(msg, loc), feature_digest(msg, "", "items"))
    put(msg, "", "moved", take(msg, "", "items"))
    pin.move("", "items", "moved", ("moved.list",))
    assert list(msg.features.feature) == ["moved"]
    assert sorted(_files(render(msg.SerializeToString(), EXAMPLE, pin=pin).root)) == ["moved.list/1.bin", "moved.list/2.bin"]
