"""Changes to a record message (SPEC 7), as pure functions: no disk, no mount, no cache.

The editors find what a path stands for (a ``Target``, or a node's ``Loc``), parse the record's
current bytes into a message, call these, and stage what they serialize. Content is judged here,
through ``codec``: what does not fit the feature's kind raises ``Invalid`` and the message is
left for the caller to throw away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.errors import Invalid
from tfrfs.view.nodes import Loc
from tfrfs.view.pins import SubNames

# (kind, shown as raw pixels) of a key across the dataset, for a key the record does not hold:
# (None, False) when the dataset has no such key either.
DatasetKind = Callable[[str, str], "tuple[str | None, bool]"]   # (key, section) -> ...
# Whether a value of a key in the dataset ends in a newline (SPEC 7 "Text"): (key, section) -> ...
DatasetNewline = Callable[[str, str], bool]


def _no_newline(key: str, section: str) -> bool:
    return False


@dataclass(frozen=True)
class Target:
    """Where content written inside a record goes."""

    section: str               # "", "context" or "feature_lists"
    key: str
    suffix: str
    item: int | None = None    # a value's index in a .list/ folder or a step's in .steps/
    raw: bool = False          # the file is a PNG of a key shown as raw pixels
    insert: bool = False       # a new item goes in before ``item`` (the others keep their values)
    item_names: tuple[str, ...] | None = None   # an item's folder: the names of its items after this write
    folder: tuple[str, ...] = ()                # an item's folder: its path inside the section
    sub: int | None = None     # a value's index in step ``item``'s own N.list/ folder
    sub_insert: bool = False   # a new value goes in before ``sub`` (a new step: ``insert``)
    sub_names: SubNames = ()   # a .steps/ folder: the names inside its steps' N.list/ after this write


def features_of(msg: Any, section: str) -> Any:
    """The feature map of ``section`` ("" or "context") of a record message."""
    if section == "context":
        return msg.context.feature
    return msg.features.feature


def reset(feats: Any, key: str) -> Any:
    """Feature ``key`` of a feature map, emptied (made if missing), to be filled anew."""
    feats[key].Clear()
    return feats[key]


def apply(msg: Any, t: Target, content: bytes, dataset_kind: DatasetKind, *, decode_raw: bool = True,
          dataset_newline: DatasetNewline = _no_newline) -> None:
    """Put ``content``, written to the file ``t`` stands for, into ``msg``. Raises ``Invalid``.

    ``dataset_newline`` answers for a value new to the record whether its ``.txt`` keeps one
    trailing newline (SPEC 7 "Text"); a value replaced answers for itself."""
    if t.section == "feature_lists":
        _apply_to_list(msg, t, content, dataset_kind, dataset_newline)
        return
    feats = features_of(msg, t.section)
    if t.item is not None:
        if t.key in feats and feats[t.key].WhichOneof("kind") not in ("bytes_list", None):
            raise Invalid(f"{t.key} is not a bytes feature")
        values = list(codec.value_from_proto(feats[t.key]).values) if t.key in feats else []
        if t.suffix == ".txt":
            replaced = [values[t.item]] if not t.insert and t.item < len(values) else None
            content = _text(content, replaced, t, dataset_newline)
        _put(values, t.item, t.insert, content)
        codec.value_to_proto(codec.Value("bytes_list", tuple(values)), reset(feats, t.key))
        return
    present = t.key in feats
    # The kind alone: value_from_proto would copy the value being replaced, however large.
    kind: str | None = (feats[t.key].WhichOneof("kind") or "none") if present else None
    raw = t.raw
    if not present:
        kind, raw = dataset_kind(t.key, t.section)
    if kind == "none":
        kind = None
    if raw and t.suffix == ".png" and decode_raw:
        set_raw_png(feats, t.key, content)
        return
    if t.suffix == ".txt" and kind in (None, "bytes_list"):
        replaced = list(codec.value_from_proto(feats[t.key]).values) if present else None
        content = _text(content, replaced, t, dataset_newline)
    codec.value_to_proto(codec.parse(t.suffix, content, kind), reset(feats, t.key))


def _text(content: bytes, replaced: list | None, t: Target, dataset_newline: DatasetNewline) -> bytes:
    """SPEC 7 "Text": a ``.txt``'s one trailing newline is kept when the value it replaces
    (``replaced``, its values) ends in one, or, for a value new to the record (None), when a value
    of the key in the dataset does."""
    if replaced is not None:
        keep = any(bytes(v).endswith(b"\n") for v in replaced)
    else:
        keep = dataset_newline(t.key, t.section)
    return codec.text_as_written(content, keep)


def set_raw_png(feats: Any, key: str, png: bytes) -> None:
    """SPEC 7: a PNG written for a key shown as raw pixels is stored as its pixels, and the
    record's height/width/depth or channels features (3.3) that exist are set to its size."""
    pixels, shape = codec.parse_raw_png(png)
    codec.value_to_proto(codec.Value("bytes_list", (pixels,)), reset(feats, key))
    prefix = key[:key.rfind("/") + 1]
    sizes = {"height": shape.height, "width": shape.width, "depth": shape.channels, "channels": shape.channels}
    for name, n in sizes.items():
        k = prefix + name
        if k in feats and feats[k].WhichOneof("kind") == "int64_list":
            codec.value_to_proto(codec.Value("int64_list", (n,)), reset(feats, k))


def _apply_to_list(msg: Any, t: Target, content: bytes, dataset_kind: DatasetKind,
                   dataset_newline: DatasetNewline) -> None:
    lists = msg.feature_lists.feature_list
    if t.item is None:
        steps = codec.parse_feature_list(content, _step_kind(lists, t.key, dataset_kind))
        flist = lists[t.key]
        del flist.feature[:]
        for step in steps:
            codec.value_to_proto(step, flist.feature.add())
        return
    flist = lists[t.key]
    old = flist.feature[t.item] if not t.insert and t.item < len(flist.feature) else None
    if t.sub is not None:
        _apply_to_step_value(flist, old, t, content, dataset_newline)
        return
    if t.suffix == ".txt":
        replaced = None if old is None else list(old.bytes_list.value)
        content = _text(content, replaced, t, dataset_newline)
    value = _parse_step(flist, old, t, content, dataset_kind)
    step = old if old is not None else _insert_step(flist, t.item)
    step.Clear()
    codec.value_to_proto(value, step)


def _parse_step(flist: Any, old: Any, t: Target, content: bytes, dataset_kind: DatasetKind) -> codec.Value:
    """The step a file of a .steps/ folder holds. Steps may differ in kind (SPEC 4 shows such a
    list as KEY.steps/), so a file other than .json is one bytes value whatever the other steps
    hold, and a .json keeps the kind of the step it replaces. A new .json step is read as the one
    number kind of the others (or of the dataset's list) when it fits, so [1, 2] among float steps
    stays float; otherwise its content tells (numbers beside images are a number step, strings
    beside numbers a text step, whichever is written first)."""
    if t.suffix != ".json":
        return codec.parse(t.suffix, content, None)
    if old is not None and old.WhichOneof("kind"):
        return codec.parse(t.suffix, content, old.WhichOneof("kind"))
    numbers = ("int64_list", "float_list")
    kinds = {f.WhichOneof("kind") for f in flist.feature if f.WhichOneof("kind")}
    hint = kinds.pop() if len(kinds) == 1 else dataset_kind(t.key, "feature_lists")[0]
    if hint in numbers:
        try:
            return codec.parse(t.suffix, content, hint)
        except Invalid:
            pass
    return codec.parse(t.suffix, content, None)


def _apply_to_step_value(flist: Any, step: Any, t: Target, content: bytes, dataset_newline: DatasetNewline) -> None:
    """One value of a step's own N.list/ folder: that value of that step, and nothing else."""
    assert t.sub is not None and t.item is not None
    if step is not None and step.WhichOneof("kind") not in ("bytes_list", None):
        raise Invalid(f"step {t.item} holds {step.WhichOneof('kind')}: its values are one .json file, "
                      f"not files in a .list/ folder")
    values = list(step.bytes_list.value) if step is not None else []
    if t.suffix == ".txt":
        replaced = [values[t.sub]] if not t.sub_insert and t.sub < len(values) else None
        content = _text(content, replaced, t, dataset_newline)
    _put(values, t.sub, t.sub_insert, content)
    if step is None:
        step = _insert_step(flist, t.item)
    step.Clear()
    codec.value_to_proto(codec.Value("bytes_list", tuple(values)), step)


def _insert_step(flist: Any, at: int) -> Any:
    """A new, empty step at position ``at`` (after the last one when ``at`` is past it)."""
    flist.feature.add()
    for i in range(len(flist.feature) - 1, at, -1):   # repeated messages have no insert
        flist.feature[i].CopyFrom(flist.feature[i - 1])
    step = flist.feature[min(at, len(flist.feature) - 1)]
    step.Clear()
    return step


def _put(values: list, at: int, insert: bool, value: bytes) -> None:
    """``value`` in before position ``at`` (``insert``) or in its place; past the end, after the
    last: no empty values are made up for numbers missing in between (SPEC 7: a folder holds the
    values of its files, in name order)."""
    if insert or at >= len(values):
        values.insert(at, value)
    else:
        values[at] = value


def _step_kind(lists: Any, key: str, dataset_kind: DatasetKind) -> str | None:
    if key in lists:
        kinds = {f.WhichOneof("kind") for f in lists[key].feature if f.WhichOneof("kind")}
        if len(kinds) == 1:
            return kinds.pop()
    kind, _ = dataset_kind(key, "feature_lists")
    return kind


LIST_KINDS = ("int64_list", "float_list", "bytes_list")


def retype_empty(feats: Any, key: str, kind: str, *, only: tuple[str, ...] = LIST_KINDS) -> bool:
    """Give feature ``key`` of a feature map, when it is an empty list of a kind in ``only`` other
    than ``kind``, the empty list of ``kind`` (SPEC 7: ``[]`` tells no kind); whether it changed."""
    if key not in feats:
        return False
    now = feats[key].WhichOneof("kind")
    if now not in only or now == kind or getattr(feats[key], now).value:
        return False
    codec.value_to_proto(codec.Value(kind, ()), feats[key])
    return True


def remove(msg: Any, loc: Loc) -> str:
    """Remove what ``loc`` stands for from ``msg``, and nothing else. Returns what went: "feature"
    (the feature itself, also with its last item), "item" (a value of a .list/ folder, or a step:
    also a step with the last value of its own N.list/) or "value" (a value of a step's N.list/)."""
    if loc.section == "feature_lists":
        lists = msg.feature_lists.feature_list
        if loc.item is None:
            del lists[loc.key]
            return "feature"
        flist = lists[loc.key]
        if loc.sub is not None:
            step = flist.feature[loc.item]
            values = list(step.bytes_list.value)
            del values[loc.sub]
            if values:
                step.Clear()
                codec.value_to_proto(codec.Value("bytes_list", tuple(values)), step)
                return "value"
        del flist.feature[loc.item]
        if not flist.feature:
            del lists[loc.key]
            return "feature"
        return "item"
    feats = features_of(msg, loc.section)
    if loc.item is None:
        del feats[loc.key]
        return "feature"
    values = list(feats[loc.key].bytes_list.value)
    del values[loc.item]
    if not values:
        del feats[loc.key]
        return "feature"
    codec.value_to_proto(codec.Value("bytes_list", tuple(values)), reset(feats, loc.key))
    return "item"


def holds(msg: Any, section: str, key: str) -> bool:
    """Whether ``msg`` has a feature (or feature list) ``key`` in ``section``."""
    return key in _container(msg, section)


def take(msg: Any, section: str, key: str) -> Any:
    """Feature (or feature list) ``key`` of ``section``, removed from ``msg``: to be put elsewhere."""
    container = _container(msg, section)
    value = type(container[key])()
    value.CopyFrom(container[key])
    del container[key]
    return value


def put(msg: Any, section: str, key: str, value: Any) -> None:
    """Give ``msg`` feature (or feature list) ``key`` of ``section`` with ``value``, as it is."""
    _container(msg, section)[key].CopyFrom(value)


def take_step(msg: Any, key: str, item: int) -> Any:
    """A copy of step ``item`` of feature list ``key``."""
    step = proto.Feature()
    step.CopyFrom(msg.feature_lists.feature_list[key].feature[item])
    return step


def put_step(msg: Any, t: Target, step: Any) -> None:
    """Step ``step`` as it is where ``t`` says (in before ``t.item``, or in its place)."""
    flist = msg.feature_lists.feature_list[t.key]
    old = flist.feature[t.item] if not t.insert and t.item is not None and t.item < len(flist.feature) else None
    (old if old is not None else _insert_step(flist, t.item or 0)).CopyFrom(step)


def _container(msg: Any, section: str) -> Any:
    return msg.feature_lists.feature_list if section == "feature_lists" else features_of(msg, section)


def with_both_parts(data: bytes) -> bytes:
    """A SequenceExample's bytes with ``context`` and ``feature_lists`` present (SPEC 4: a record
    committed without one gets it empty); ``data`` itself when it has both or does not parse."""
    try:
        seq = proto.SequenceExample.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf raises several types; such bytes stay as they are
        return data
    if seq.HasField("context") and seq.HasField("feature_lists"):
        return data
    seq.context.SetInParent()
    seq.feature_lists.SetInParent()
    return seq.SerializeToString(deterministic=True)


def item_count(msg: Any, section: str, key: str) -> int:
    """How many items (values of a bytes feature, or steps) ``key`` of ``section`` holds."""
    if section == "feature_lists":
        lists = msg.feature_lists.feature_list
        return len(lists[key].feature) if key in lists else 0
    feats = features_of(msg, section)
    return len(codec.value_from_proto(feats[key]).values) if key in feats else 0
