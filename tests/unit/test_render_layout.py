"""A record's folder laid out from its layout's steps (render._plan, remembered per set of keys):
every feature at the path names.layout gives it, each nested-key folder with its key prefix, the
same tree when a writable mount also asks how each feature is shown, and the same again once the
steps are remembered; for nested keys, lists and keys whose names clash.

The expected tree of the first test is written out by hand from SPEC 3.1 and 3.2."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tfrfs.format import names, proto
from tfrfs.view.nodes import DataFile, Dir, Loc
from tfrfs.view.render import Options, render

PLANNED = Options("example", True, 7)
STEPWISE = Options("example", True, 7, report_shown=True)


def _example(features: dict[str, list]) -> bytes:
    msg = proto.Example()
    for key, values in features.items():
        f = msg.features.feature[key]
        if values and isinstance(values[0], bytes):
            f.bytes_list.value.extend(values)
        elif values and isinstance(values[0], float):
            f.float_list.value.extend(values)
        else:
            f.int64_list.value.extend(values)
    return msg.SerializeToString()


def _views(folder: Dir) -> list[tuple[str, object]]:
    """(key, what it is shown as, with its suffix) of every feature below ``folder``."""
    out: list[tuple[str, object]] = []
    for name, child in folder.children.items():
        key = child.xattrs.get("user.tfrfs.key", b"").decode()
        if isinstance(child, DataFile) or child.loc is not None:   # a feature (a file, or its .list/)
            out.append((key, _Suffix(name[len(name.rsplit(".", 1)[0]):] if "." in name else "")))
        else:
            out += _views(child)
    return out


class _Suffix:
    def __init__(self, suffix: str) -> None:
        self.suffix = suffix


def _tree(node: object) -> object:
    """Everything a folder shows, in its order."""
    if isinstance(node, Dir):
        return ("dir", dict(node.xattrs), node.loc, node.mtime_ns,
                [(name, _tree(child)) for name, child in node.children.items()])
    assert isinstance(node, DataFile)
    return ("file", node.data, dict(node.xattrs), node.loc, node.mtime_ns, node.damaged)


def test_nested_keys_are_laid_out_as_spec_3_1_says() -> None:
    data = _example({"image/encoded": [b"\xff\xd8\xff\xe0jpeg"], "image/object/bbox/xmin": [0.25, 0.5],
                     "image/object/class/label": [3], "label": [1], "caption": [b"a cat", b"on a mat"]})
    root = render(data, PLANNED).root
    assert sorted(root.children) == ["caption.json", "image", "label.json"]   # (texts: a JSON list)
    assert root.children["caption.json"].data == b'["a cat", "on a mat"]\n'   # type: ignore[union-attr]
    image = root.children["image"]
    assert isinstance(image, Dir) and dict(image.xattrs) == {"user.tfrfs.key": b"image"}
    assert sorted(image.children) == ["encoded.jpg", "object"]
    bbox = image.children["object"].children["bbox"]   # type: ignore[union-attr]
    assert isinstance(bbox, Dir) and dict(bbox.xattrs) == {"user.tfrfs.key": b"image/object/bbox"}
    xmin = bbox.children["xmin.json"]
    assert isinstance(xmin, DataFile) and xmin.data == b"[0.25, 0.5]\n"
    assert dict(xmin.xattrs) == {"user.tfrfs.key": b"image/object/bbox/xmin", "user.tfrfs.kind": b"float_list"}
    assert xmin.loc == Loc("", "image/object/bbox/xmin", None, False)
    assert _tree(root) == _tree(render(data, STEPWISE).root)


_KEY = st.lists(st.sampled_from(["a", "b", "image", "x.json", "A", "é", ""]), min_size=1, max_size=4).map("/".join)
_VALUES = st.one_of(st.lists(st.integers(-5, 5), max_size=3), st.lists(st.sampled_from([0.5, 1.25]), min_size=1, max_size=2),
                    st.lists(st.sampled_from([b"text", b"\xff\xd8\xff\xe0", b"\x00\x01", b"two"]), min_size=1, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEY, _VALUES, min_size=1, max_size=8))
def test_the_plan_lays_out_any_record_as_the_steps_do(features: dict[str, list]) -> None:
    data = _example(features)
    planned, stepwise = render(data, PLANNED), render(data, STEPWISE)
    assert planned.failure is None and stepwise.failure is None
    assert _tree(planned.root) == _tree(stepwise.root)
    files = 0
    for key, comps in names.layout([(k, v.suffix) for k, v in _views(planned.root)]).items():
        node = planned.root
        for depth, comp in enumerate(comps):
            node = node.children[comp]   # type: ignore[union-attr]
            if depth < len(comps) - 1:   # a nested-key folder: the prefix of the first key under it
                assert isinstance(node, Dir) and node.loc is None
                assert node.xattrs["user.tfrfs.key"].decode().count("/") == depth
        assert node.xattrs["user.tfrfs.key"] == key.encode()   # type: ignore[union-attr]
        files += 1
    assert files == len(features) == sum(1 for _ in _views(planned.root))
    again = render(data, PLANNED)   # (the plan remembered)
    assert _tree(again.root) == _tree(planned.root)
