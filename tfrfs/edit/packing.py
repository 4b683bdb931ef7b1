"""A record folder's files into the record (SPEC 10, ``tfrfs pack``): the inverse of the view.

A folder laid out as sections 3-4 show a record (``cp -a`` out of a mount, or made by hand) is
read with the rules a ``--rw`` mount stages files by: a name stands for its key as
``names.path_to_key`` decodes it, a file's content is its value as ``codec.parse``,
``codec.parse_list`` and ``codec.parse_feature_list`` take it (SPEC 7), and a ``.txt`` written by
hand loses the one newline an editor adds unless the key's values end in one.

What a file alone cannot tell comes from what the copy kept or the user gave (``Hints``): the
exact key and the kind in the ``user.tfrfs.key`` and ``user.tfrfs.kind`` xattrs (``cp -a`` keeps
them; a file that has them came out of a mount, so its bytes are the stored ones), else from a
``.tfrfs/schema.json`` (``--schema``). An empty list whose kind nothing tells is an error naming
the file, as is everything else that cannot be packed: each problem is ``path: reason``.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Any

from tfrfs.errors import Invalid
from tfrfs.format import codec, names, proto
from tfrfs.view.render import RAW_XATTR

KEY_XATTR = "user.tfrfs.key"
KIND_XATTR = "user.tfrfs.kind"
LENGTH_XATTR = "user.tfrfs.length"   # of a record folder: its record's bytes (SPEC 5)
SECTIONS = ("context", "feature_lists")


@dataclass(frozen=True)
class KeyHint:
    kind: str | None = None
    newline: bool = False     # values of the key end in a newline (SPEC 7 "Text")
    raw: bool = False         # the key is only ever shown as raw pixels (its .png holds pixels)


@dataclass(frozen=True)
class Hints:
    """What a ``.tfrfs/schema.json`` says of each key: (section, key) -> KeyHint. Picklable."""

    keys: dict[tuple[str, str], KeyHint] = field(default_factory=dict)

    @classmethod
    def from_schema(cls, doc: dict) -> "Hints":
        out: dict[tuple[str, str], KeyHint] = {}
        for section, table in (("", doc.get("features") or {}), ("feature_lists", doc.get("feature_lists") or {})):
            for key, about in table.items():
                shown = about.get("shown_as") or []
                out[(section, key)] = KeyHint(about.get("kind"), bool(about.get("ending_in_newline")),
                                              bool(shown) and all(s.startswith("raw pixels") for s in shown))
                if section == "":
                    out.setdefault(("context", key), out[(section, key)])
        return cls(out)

    def of(self, section: str, key: str) -> KeyHint:
        return self.keys.get((section, key)) or KeyHint()


class Problems(Exception):
    """Files of a record that cannot be packed: ``problems``, each ``path: reason``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def read_xattr(path: str, name: str) -> str | None:
    """The text of xattr ``name`` of ``path`` (not followed if a link), or None where it has none."""
    try:
        return os.getxattr(path, name, follow_symlinks=False).decode("utf-8", "surrogatepass")
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, getattr(errno, "ENOATTR", errno.ENODATA)):
            return None
        raise


def record_bytes(folder: str, kind: str, hints: Hints = Hints()) -> bytes:
    """The serialized record (``kind``: ``example`` or ``sequence``) the record folder ``folder``
    shows. Raises ``Problems`` naming every file that cannot be packed."""
    problems: list[str] = []
    if read_xattr(folder, LENGTH_XATTR) == "0" and not [e for e in os.listdir(folder) if not names.is_scratch(e)]:
        return b""   # a record of no bytes (an empty folder from a mount, which says its length)
    if kind == "sequence":
        msg: Any = proto.SequenceExample()
        for section in SECTIONS:
            sub = os.path.join(folder, section)
            if os.path.isdir(sub):   # present, even empty, as the folder is (SPEC 4)
                getattr(msg, section).SetInParent()
                _section(msg, sub, section, hints, problems)
        for name in sorted(os.listdir(folder)):
            if name not in SECTIONS and not names.is_scratch(name):
                problems.append(f"{os.path.join(folder, name)}: a SequenceExample record holds only context/ "
                                "and feature_lists/")
    else:
        msg = proto.Example()
        msg.features.SetInParent()   # as TensorFlow writes an Example, even one with no feature
        _section(msg, folder, "", hints, problems)
    if problems:
        raise Problems(problems)
    return msg.SerializeToString()


def _section(msg: Any, root: str, section: str, hints: Hints, problems: list[str]) -> None:
    """Every feature file under ``root`` (a record folder, or its ``context/`` or
    ``feature_lists/``) into ``msg``'s ``section``."""
    claimed: dict[str, str] = {}   # key -> the path that gave it

    def claim(key: str, path: str) -> bool:
        if key in claimed:
            problems.append(f"{path}: a second file for the key {key!r} (the first: {claimed[key]})")
            return False
        claimed[key] = path
        return True

    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        parts = () if rel == "." else tuple(rel.split(os.sep))
        dirs.sort()
        keep = []
        for d in dirs:
            if names.is_scratch(d):
                continue
            if names.split_suffix(d)[1] in codec.DIR_SUFFIXES:
                path = os.path.join(folder, d)
                try:
                    key = _key_of(path, (*parts, d))
                    if claim(key, path):
                        _items_folder(msg, path, section, key, names.split_suffix(d)[1] or "", hints, problems)
                except (Invalid, OSError) as exc:
                    problems.append(f"{path}: {exc}")
                continue
            keep.append(d)
        dirs[:] = keep
        for name in sorted(files):
            if names.is_scratch(name):
                continue
            path = os.path.join(folder, name)
            try:
                key = _key_of(path, (*parts, name))
                if claim(key, path):
                    _file(msg, path, section, key, hints)
            except (Invalid, OSError) as exc:
                problems.append(f"{path}: {exc}")


def _key_of(path: str, components: tuple[str, ...]) -> str:
    """The key a file or feature folder stands for: the ``user.tfrfs.key`` xattr a copy kept
    (exact even for a shortened name), else its name decoded (SPEC 3.1)."""
    kept = read_xattr(path, KEY_XATTR)
    if kept is not None:
        return kept
    key, suffix = names.path_to_key(components)
    if suffix is None or (suffix not in codec.SUFFIXES and suffix not in codec.DIR_SUFFIXES):
        raise Invalid("a feature file needs a suffix from .json .txt .bin .jpg .png .gif .bmp .webp .tif .wav "
                      ".flac .mp3 .ogg (names starting with '.' or ending with '~' are left out)")
    return key


def _kind(path: str, section: str, key: str, hints: Hints) -> tuple[str | None, bool]:
    """(kind, whether the file came out of a mount): the xattr's, else the schema's."""
    kept = read_xattr(path, KIND_XATTR)
    if kept is not None:
        return kept, True
    return hints.of(section, key).kind, False


def _file(msg: Any, path: str, section: str, key: str, hints: Hints) -> None:
    suffix = names.split_suffix(os.path.basename(path))[1] or ""
    with open(path, "rb") as f:
        data = f.read()
    kind, copied = _kind(path, section, key, hints)
    if section == "feature_lists":
        if suffix != ".json":
            raise Invalid("a feature list is a KEY.json of per-step arrays or a KEY.steps/ folder")
        if kind == "feature_list":   # (the xattr of a list whose steps differ in kind, or that has none)
            kind = None
        steps = codec.parse_feature_list(data, kind)
        if kind is None and steps and not any(s.values for s in steps):
            raise _no_kind()   # steps all empty: their kind is not in the file
        flist = msg.feature_lists.feature_list[key]
        for step in steps:
            codec.value_to_proto(step, flist.feature.add())
        return
    hint = hints.of(section, key)
    if suffix == ".txt" and not copied:
        data = codec.text_as_written(data, hint.newline)
    if suffix == ".json" and kind is None and codec.parse(suffix, data, None) == codec.Value("bytes_list", ()):
        raise _no_kind()
    feats = msg.context.feature if section == "context" else msg.features.feature
    if suffix == ".png" and (hint.raw or read_xattr(path, RAW_XATTR) == "raw pixels"):
        from tfrfs.edit.mutate import set_raw_png
        set_raw_png(feats, key, data)
        return
    codec.value_to_proto(codec.parse(suffix, data, kind), feats[key])


def _no_kind() -> Invalid:
    return Invalid("[] tells no kind: copy with cp -a (it keeps the user.tfrfs.kind xattr) or give --schema "
                   "with the dataset's .tfrfs/schema.json")


def _items_folder(msg: Any, path: str, section: str, key: str, folder_suffix: str, hints: Hints,
                  problems: list[str]) -> None:
    """A ``KEY.list/`` folder (a bytes feature's values) or ``KEY.steps/`` (a feature list's steps)."""
    entries = sorted((e for e in os.listdir(path) if not names.is_scratch(e)), key=_index_order)
    if folder_suffix == ".list":
        items = []
        for name in entries:
            stem, suffix = names.split_suffix(name)
            if not stem.isdigit() or suffix is None or os.path.isdir(os.path.join(path, name)):
                problems.append(f"{os.path.join(path, name)}: files in a .list/ folder are named by their index "
                                "and a suffix, e.g. 0.jpg")
                continue
            with open(os.path.join(path, name), "rb") as f:
                items.append((suffix, f.read()))
        feats = msg.context.feature if section == "context" else msg.features.feature
        codec.value_to_proto(codec.parse_list(items), feats[key])
        return
    if section != "feature_lists":
        raise Invalid(".steps/ folders belong in feature_lists/")
    kind = hints.of(section, key).kind
    flist = msg.feature_lists.feature_list[key]
    for name in entries:
        step_path = os.path.join(path, name)
        stem, suffix = names.split_suffix(name)
        if not stem.isdigit():
            problems.append(f"{step_path}: steps are named by their index, e.g. 0.json or 0.list/")
            continue
        if os.path.isdir(step_path):
            subs = sorted((e for e in os.listdir(step_path) if not names.is_scratch(e)), key=_index_order)
            items = []
            for sub in subs:
                with open(os.path.join(step_path, sub), "rb") as f:
                    items.append((names.split_suffix(sub)[1] or "", f.read()))
            codec.value_to_proto(codec.parse_list(items), flist.feature.add())
            continue
        with open(step_path, "rb") as f:
            data = f.read()
        step_kind = read_xattr(step_path, KIND_XATTR) or kind
        if step_kind == "feature_list":   # the list's xattr: its steps differ in kind; this one's content tells
            step_kind = None
        codec.value_to_proto(codec.parse(suffix or "", data, step_kind), flist.feature.add())


def _index_order(name: str) -> tuple[int, str]:
    stem = names.split_suffix(name)[0]
    return (int(stem), name) if stem.isdigit() else (1 << 62, name)
