"""Names that stay stable until a commit (SPEC 7, README "Names inside a record stay stable too").

The SPEC rules name a record's files from its current values alone. In a writable mount that is
not enough: after ``rm KEY.steps/0.jpg`` the rules would renumber the other steps, and ``rm -r``,
which listed the folder first, would then meet names that moved. So a change to a record takes a
``NamePin`` — how each feature is shown just before the change, with a digest of its value — and
the renderer keeps a pinned name wherever the feature still has the value it was pinned with.

Everything here is pure data and functions of it, testable without a mount.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping

from tfrfs.format import codec
from tfrfs.format import names
from tfrfs.format import proto
from tfrfs.view.nodes import Loc

PinKey = tuple[str, str]   # (section, key) of one feature of a record; section "", "context", "feature_lists"
Path = tuple[str, ...]     # an entry's path inside its section's folder
# A .steps/ folder's steps shown as their own N.list/ folders: (step name, its items' names), so
# removing one value of a step renames none of the others (and a step left with one value stays
# a folder) until a commit.
SubNames = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class Shown:
    """How one feature of a record is shown: the parts of its name and look that can depend on
    more than its own value (SPEC 3.1 clashes, 3.2 item numbering, 3.3 raw pixels, 4 steps)."""

    folders: Path                            # the folders above its entry, inside its section's folder
    stem: str                                # its entry's name without the suffix
    shape: codec.Shape | None = None         # shown as a PNG of raw pixels of this shape
    item_names: tuple[str, ...] | None = None   # a .list/ or .steps/ folder: its items' names, by position
    pinned: bool = False                     # shown otherwise than the SPEC rules show its value now
    digest: bytes = b""                      # in a pin: the value it was shown for
    written: str = ""                        # the file name its value was written through, which
                                             # stays a name for it (lookups only) until a commit
    sub_names: SubNames = ()                 # a .steps/ folder: the names inside its steps' N.list/

    def path(self, suffix: str) -> Path:
        return self.folders + (self.stem + suffix,)


class NamePin:
    """The names a changed record's features keep until a commit.

    An entry holds while its feature still has the value it was shown for, so removing a feature,
    a step or a list item never renames the others: a raw pixel array whose height went keeps its
    ``.png``, the items after a removed one keep their numbers, a ``.list/`` left with one value
    stays a folder. A feature whose value a write changed is shown by the SPEC rules again (its
    item names excepted, which the editor sets itself with ``set_item_names``; and the name it
    was written through still finds it: ``keep_written``). Pins live in
    memory only: a commit, or the next mount, shows every record by the rules.
    """

    def __init__(self, entries: dict[PinKey, Shown] | None = None) -> None:
        self.entries: dict[PinKey, Shown] = entries or {}

    def get(self, section: str, key: str) -> Shown | None:
        return self.entries.get((section, key))

    def unchanged(self, section: str, features: Mapping[str, Any]) -> dict[str, Shown]:
        """The entries of ``section`` whose feature (a proto message in ``features``) still has
        the value it was pinned with: only those keep their names."""
        out = {}
        for key, message in features.items():
            shown = self.entries.get((section, key))
            if shown is not None and shown.digest == value_digest(message):
                out[key] = shown
        return out

    def set_item_names(self, section: str, key: str, item_names: tuple[str, ...], digest: bytes,
                       folder: Path = (), sub_names: SubNames = ()) -> None:
        """Show ``key`` for its new value (``digest``) as a .list/ or .steps/ folder with these item
        names (and, in a .steps/ folder, these names inside its steps' N.list/ folders): where it is
        shown now, or for a key not shown yet at ``folder`` (its path in the section)."""
        shown = self.entries.get((section, key))
        if shown is not None:
            self.entries[(section, key)] = replace(shown, shape=None, item_names=item_names, digest=digest,
                                                   sub_names=sub_names)
        elif folder:
            stem, _ = names.split_suffix(folder[-1])
            self.entries[(section, key)] = Shown(folder[:-1], stem, None, item_names, False, digest,
                                                 sub_names=sub_names)

    def keep_written(self, section: str, key: str, folders: Path, written: str, digest: bytes) -> None:
        """``key``'s new value (``digest``) was written through the file ``written`` in ``folders``:
        that name keeps finding it until a commit, also where the rules now show the value under
        another suffix (an empty or text value written to KEY.bin is KEY.txt), so the program that
        wrote it can open it again by the name it used. A name for lookups only: listings show
        the rules' name, and one name per file."""
        stem, _ = names.split_suffix(written)
        self.entries[(section, key)] = Shown(folders, stem, None, None, False, digest, written=written)

    def drop(self, loc: Loc, gone: str, digest: bytes) -> None:
        """``loc`` was removed from the record (``gone``: what went, as ``mutate.remove`` says), which
        holds ``digest`` for the feature now: the names of the rest stay."""
        if gone == "feature":
            self.entries.pop((loc.section, loc.key), None)   # a value that comes next is shown afresh
        elif gone == "value" and loc.item is not None and loc.sub is not None:
            self.drop_sub_name(loc.section, loc.key, loc.item, loc.sub, digest)
        elif gone == "item" and loc.item is not None:
            self.drop_item_name(loc.section, loc.key, loc.item, digest)

    def drop_item_name(self, section: str, key: str, item: int, digest: bytes) -> None:
        """After item ``item`` of a .list/ or .steps/ folder was removed, the items after it keep
        their names (``rm -r`` has listed them already): the folder shows the names it had, less one."""
        shown = self.entries.get((section, key))
        if shown is None or shown.item_names is None or item >= len(shown.item_names):
            return
        rest = shown.item_names[:item] + shown.item_names[item + 1:]
        gone = shown.item_names[item]
        self.set_item_names(section, key, rest, digest, sub_names=tuple(s for s in shown.sub_names if s[0] != gone))

    def drop_sub_name(self, section: str, key: str, item: int, sub: int, digest: bytes) -> None:
        """After value ``sub`` of step ``item``'s own N.list/ folder was removed, the values after it
        keep their names, and the step stays a folder."""
        shown = self.entries.get((section, key))
        if shown is None or shown.item_names is None or item >= len(shown.item_names):
            return
        step = shown.item_names[item]
        subs = dict(shown.sub_names)
        if step not in subs or sub >= len(subs[step]):
            return
        subs[step] = subs[step][:sub] + subs[step][sub + 1:]
        self.set_item_names(section, key, shown.item_names, digest, sub_names=tuple(subs.items()))

    def move(self, section: str, key: str, new_key: str, path: Path) -> None:
        """``key``'s value moved, as it is, to ``new_key`` shown at ``path`` (in its section's
        folder): its items keep their names there."""
        shown = self.entries.pop((section, key), None)
        if shown is None:
            return
        stem, _ = names.split_suffix(path[-1])
        self.entries[(section, new_key)] = replace(shown, folders=path[:-1], stem=stem, written="")

    def restricted_to(self, keys: set[PinKey]) -> "NamePin":
        return NamePin({k: v for k, v in self.entries.items() if k in keys})

    def __bool__(self) -> bool:
        return bool(self.entries)


def value_digest(message: Any) -> bytes:
    """Identifies a Feature's (or a FeatureList's) value, so a pin knows whether it changed."""
    return hashlib.blake2b(message.SerializeToString(deterministic=True), digest_size=16).digest()


def feature_digest(message: Any, section: str, key: str) -> bytes:
    """The digest of feature ``key`` of ``section`` in a record message (b"" if it has none)."""
    if section == "feature_lists":
        container = message.feature_lists.feature_list
    else:
        container = message.context.feature if section == "context" else message.features.feature
    return value_digest(container[key]) if key in container else b""


def digests_of(message: Any) -> dict[PinKey, bytes]:
    """The digest of every feature (and feature list) of a parsed record."""
    if isinstance(message, proto.SequenceExample):
        out = {("context", k): value_digest(f) for k, f in message.context.feature.items()}
        out.update({("feature_lists", k): value_digest(f) for k, f in message.feature_lists.feature_list.items()})
        return out
    return {("", k): value_digest(f) for k, f in message.features.feature.items()}


def pin_from_shown(shown: Mapping[PinKey, Shown], message: Any) -> NamePin:
    """The pin a change to a record starts from: how its features are shown now (``shown``, as the
    renderer reported it), each with the digest of its current value in ``message``."""
    digests = digests_of(message)
    return NamePin({k: replace(s, digest=digests[k]) for k, s in shown.items() if k in digests})


def apply_pinned_paths(layout: Mapping[str, Path], pinned: Mapping[str, Path]) -> tuple[Mapping[str, Path], set[str]]:
    """The paths of ``layout`` (key -> path, by the SPEC rules) with each key in ``pinned`` moved to
    its pinned path, where that clashes with no other entry; and the keys so moved.

    So a clash (SPEC 3.1) that a removed feature no longer makes does not rename the other one.
    """
    moves = sorted((key, path) for key, path in pinned.items() if layout[key] != path)
    if not moves:
        return layout, set()
    paths = dict(layout)
    files = {path: key for key, path in paths.items()}
    folders = Counter(path[:i] for path in paths.values() for i in range(1, len(path)))

    def count(path: Path, by: int) -> None:
        for i in range(1, len(path)):
            folders[path[:i]] += by

    moved = set()
    for key, wanted in moves:
        old = paths[key]
        del files[old]
        count(old, -1)
        free = wanted not in files and not folders[wanted] and \
            not any(wanted[:i] in files for i in range(1, len(wanted)))
        new = wanted if free else old
        files[new] = key
        count(new, 1)
        paths[key] = new
        if free:
            moved.add(key)
    return paths, moved
