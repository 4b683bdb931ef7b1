"""A record's view as a pure function (SPEC 3 and 4): bytes in, folder of feature files out.

``render`` takes a record's bytes, its shard's record kind and the mount's options (and, in a
writable mount, the names a change pinned: see ``pins``) and returns the record folder's entries,
sizes and xattrs. ``render_in_shard`` does the same for a large Example whose large images are to
be served from the shard itself rather than held in memory. An Example in the usual encoding,
with no pinned names, is read and shown in C where that was built (``codec.compiled_files``):
the same files as protobuf and ``codec`` give, which still show every other record. Neither
does I/O, takes a lock or keeps a cache: the record store calls them and caches what they
return; the library face (``tfrfs.open``) and any other reader of records would call the same
functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from tfrfs.format import codec
from tfrfs.format import names
from tfrfs.format import proto
from tfrfs.format import record_kinds
from tfrfs.format import wire
from tfrfs.view.nodes import DataFile, Dir, InShard, Loc, Node
from tfrfs.view.pins import NamePin, PinKey, Shown, apply_pinned_paths

IN_SHARD_MIN = 64 << 10   # an image this large is served from its shard (read-only mounts)
_FILES = codec.compiled_files()   # an Example in the usual encoding, shown in C (None: not built)


@dataclass(frozen=True)
class Options:
    kind: str             # the shard's record kind: "example", "sequence" or "raw"
    decode_raw: bool      # SPEC 3.3: raw pixel arrays shown as PNG
    mtime_ns: int         # every entry's time: the shard's
    report_shown: bool = False   # writable mounts: say how each feature is shown (pins start from it)


@dataclass
class RecordView:
    root: Dir
    cost: int                                   # about the bytes it holds (the cache's budget)
    shown: dict[PinKey, Shown] = field(default_factory=dict)   # with report_shown only
    pin: NamePin | None = None                  # what of the given pin still changes the view
    failure: str | None = None                  # the record does not parse: why (root is empty)
    damaged: str | None = None                  # its data checksum fails: why (SPEC 6: EIO to list it)


def render(data: bytes, options: Options, *, damaged: str | None = None, pin: NamePin | None = None,
           made: bool = False) -> RecordView:
    """The view of a record of ``options.kind`` (example or sequence) holding ``data``.

    ``damaged``: why its bytes cannot be trusted (a failed data checksum); its files then fail to
    read with that reason. A record that does not parse has an empty view and ``failure`` set.
    ``made``: the record was made in this mount (not yet committed): a SequenceExample shows
    ``context/`` and ``feature_lists/`` only once they were made (SPEC 4), so ``cp -r``, which
    makes them in the record it just made without looking, finds them absent; a record as stored
    shows both, even empty.
    """
    p = _Pinning(pin, {} if options.report_shown else None)
    mtime = options.mtime_ns
    if _FILES is not None and options.kind == "example" and pin is None and not options.report_shown:
        files = _FILES(data, options.decode_raw)
        if files is not None:   # (else: an unusual record, shown by the Python path below)
            views = {key: codec.FileView(suffix, body) for key, _, suffix, body in files}
            root = _place(views, {key: kind for key, kind, _, _ in files}, "", mtime, damaged, p, {})
            return RecordView(root, 256 + len(data) * 2, damaged=damaged)
    try:
        if options.kind == "sequence":
            seq = record_kinds.decode(data, "sequence")
            root = Dir(mtime_ns=mtime)
            if not made or seq.HasField("context"):
                root.children["context"] = _features_dir(seq.context.feature, "context", options, damaged, p)
            if not made or seq.HasField("feature_lists"):
                root.children["feature_lists"] = _feature_lists_dir(seq.feature_lists.feature_list, options,
                                                                    damaged, p)
        else:
            root = _features_dir(record_kinds.decode(data, "example").features.feature, "", options, damaged, p)
    except record_kinds.Unparsable as exc:   # shown raw (SPEC 2)
        return RecordView(Dir(mtime_ns=mtime), 64, failure=exc.message, damaged=damaged)
    except Exception as exc:  # noqa: BLE001 - a message read lazily may fail only as its features are read
        return RecordView(Dir(mtime_ns=mtime), 64, failure=record_kinds.problem_text(options.kind, exc),
                          damaged=damaged)
    shown = p.shown or {}
    return RecordView(root, 256 + len(data) * 2 + 128 * len(shown), shown, p.remaining(), damaged=damaged)


def render_in_shard(data: memoryview, options: Options, *, shard: int, data_offset: int,
                    pin: NamePin | None = None) -> RecordView | None:
    """The view of a large Example (read-only mounts) whose images and sounds of at least
    ``IN_SHARD_MIN`` bytes are left in the shard: shown as ``InShard`` entries at their place in
    the stream (``data`` starts at ``data_offset`` of shard ``shard``), so a 2 MB JPEG is neither
    copied into a message nor held in memory. Every other feature is parsed from its own bytes.

    None when the record is not in the usual encoding (see ``wire``) or a feature does not parse:
    then ``render`` shows it, and says what is wrong.
    """
    spans = wire.feature_spans(data)
    if spans is None:
        return None
    values: dict[str, codec.Value] = {}
    in_shard: dict[str, codec.FileView] = {}
    try:
        for key, (start, end) in spans.items():
            if end - start >= IN_SHARD_MIN:
                one = wire.single_bytes_value(data, start, end)
                if one is not None:
                    piece = data[one[0]:one[1]]
                    suffix = codec.sniff_media(piece)
                    if suffix is not None:
                        values[key] = codec.Value("bytes_list", (piece,))
                        where = InShard(shard, data_offset + one[0], len(piece))
                        in_shard[key] = codec.FileView(suffix, where)   # type: ignore[arg-type]
                        continue
            values[key] = codec.value_from_proto(proto.Feature.FromString(data[start:end]))
        root = _features_dir({}, "", options, None, _Pinning(pin, None), values, in_shard)
    except Exception:  # noqa: BLE001 - a feature that does not parse: render() reports it
        return None
    return RecordView(root, 256 + _bytes_held(root))


# --- inside ------------------------------------------------------------------------

@dataclass
class _Pinning:
    """What rendering one record needs to keep pinned names, and what it finds out."""

    pin: NamePin | None
    shown: dict[PinKey, Shown] | None     # filled when asked for: how every feature is shown
    overrides: set[PinKey] = field(default_factory=set)   # pin entries that changed what is shown

    def unchanged(self, section: str, features: Mapping[str, Any]) -> dict[str, Shown]:
        return self.pin.unchanged(section, features) if self.pin is not None else {}

    def remaining(self) -> NamePin | None:
        if self.pin is None or not self.overrides:
            return None
        return self.pin.restricted_to(self.overrides)


def _features_dir(features: Mapping, section: str, options: Options, damaged: str | None, p: _Pinning,
                  values: Mapping[str, codec.Value] | None = None,
                  in_shard: Mapping[str, codec.FileView] | None = None) -> Dir:
    """The folder of a record's features (``values`` given: ``features`` is not read;
    ``in_shard``: views of images left in the shard, unless they are raw pixel arrays)."""
    if values is None:
        values = {key: codec.value_from_proto(feat) for key, feat in features.items()}
    shapes = codec.raw_shapes(values) if options.decode_raw else {}
    unchanged = p.unchanged(section, features)
    views: dict[str, codec.View] = {}
    for key, value in values.items():
        shown = unchanged.get(key)
        shape = shapes.get(key)
        if shape is None and shown is not None and shown.shape is not None:
            # Its height, width or depth went or changed, its pixels did not: it stays the PNG
            # it was (same name, same picture) until a commit.
            shape = shown.shape
            p.overrides.add((section, key))
        views[key] = in_shard[key] if in_shard and key in in_shard and shape is None \
            else codec.render(value, shape)
        if shown is not None and shown.item_names is not None and value.kind == "bytes_list":
            items = [codec.render(codec.Value("bytes_list", (v,))) for v in value.values]
            views[key] = _pinned_items(views[key], shown.item_names, ".list", items, (section, key), p)
    return _place(views, {k: v.kind for k, v in values.items()}, section, options.mtime_ns, damaged, p, unchanged)


def _feature_lists_dir(lists: Mapping, options: Options, damaged: str | None, p: _Pinning) -> Dir:
    views: dict[str, codec.View] = {}
    kinds: dict[str, str] = {}
    unchanged = p.unchanged("feature_lists", lists)
    for key, flist in lists.items():
        steps = [codec.value_from_proto(f) for f in flist.feature]
        views[key] = codec.render_feature_list(steps)
        shown = unchanged.get(key)
        if shown is not None and shown.item_names is not None:
            subs = dict(shown.sub_names)
            step_views = [_pinned_step(step, subs.get(name)) for name, step in zip(shown.item_names, steps)]
            views[key] = _pinned_items(views[key], shown.item_names, ".steps", step_views, ("feature_lists", key), p)
        step_kinds = {s.kind for s in steps}
        kinds[key] = step_kinds.pop() if len(step_kinds) == 1 else "feature_list"
    return _place(views, kinds, "feature_lists", options.mtime_ns, damaged, p, unchanged)


def _pinned_items(by_rules: codec.View, item_names: tuple[str, ...], suffix: str, items: list[codec.View],
                  where: PinKey, p: _Pinning) -> codec.View:
    """A .list/ or .steps/ folder shown with the item names it had: after an item was removed,
    the later ones keep their numbers, and one value or all-text steps left stay a folder."""
    if len(items) != len(item_names):
        return by_rules    # the pin no longer matches the value: the rules decide
    pinned = codec.DirView(suffix, tuple(zip(item_names, items)))
    if pinned == by_rules:
        return by_rules
    p.overrides.add(where)
    return pinned


def _pinned_step(step: codec.Value, names: tuple[str, ...] | None) -> codec.View:
    """A step shown as its own N.list/ folder with the names its values had (``names``), as long
    as it holds that many bytes values; otherwise by the rules."""
    if names is None or step.kind != "bytes_list" or len(step.values) != len(names):
        return codec.render(step)
    return codec.DirView(".list", tuple((name, codec.render(codec.Value("bytes_list", (v,))))
                                        for name, v in zip(names, step.values)))


def _place(views: Mapping[str, codec.View], kinds: Mapping[str, str], section: str, mtime: int,
           damaged: str | None, p: _Pinning, unchanged: Mapping[str, Shown]) -> Dir:
    """Lay the features of one folder out by the key -> path rules, pinned features where they were."""
    root = Dir(mtime_ns=mtime)
    paths = layout = names.layout([(key, view.suffix) for key, view in views.items()])
    if unchanged:
        pinned = {key: s.path(views[key].suffix) for key, s in unchanged.items()}
        paths, moved = apply_pinned_paths(paths, pinned)
        p.overrides.update((section, key) for key in moved)
    plain = not unchanged and p.shown is None   # (the usual record: nothing more to note per feature)
    folders = [root]
    for folder, inside, name, key in (_plan(paths) if paths is layout else _steps(paths)):
        parent = folders[inside]
        if folder:
            made = parent.children[name] = Dir(mtime_ns=mtime, xattrs=key_xattrs(key, None))
            folders.append(made)
            continue
        view = views[key]
        raw = isinstance(view, codec.FileView) and view.raw_shape is not None
        node = parent.children[name] = _node(view, key_xattrs(key, kinds[key], raw), mtime, damaged,
                                             feature_loc(section, key, raw))
        if plain:
            continue
        comps = paths[key]
        written = _written_name(unchanged.get(key), view, comps)
        if written:
            if parent.aliases is None:
                parent.aliases = {}
            parent.aliases[written] = node
            p.overrides.add((section, key))
        if p.shown is not None:
            p.shown[(section, key)] = _shown(view, comps, (section, key) in p.overrides, written)
    return root


_Step = tuple[bool, int, str, str]
_PLANS: dict[int, tuple[Mapping[str, tuple[str, ...]], tuple[_Step, ...]]] = {}


def _steps(paths: Mapping[str, tuple[str, ...]]) -> tuple[_Step, ...]:
    """The steps that lay ``paths`` out, in order: (True, parent, name, key) makes a nested-key
    folder (its key the prefix it stands for, from the first key under it), (False, parent,
    name, key) places a feature; ``parent`` counts the folders made so far, the record's own
    being 0. (Paths never clash: names.layout and pins.apply_pinned_paths see to it.)"""
    steps: list[_Step] = []
    made: dict[tuple[str, ...], int] = {(): 0}
    for key, comps in paths.items():
        parent: tuple[str, ...] = ()
        for depth, comp in enumerate(comps[:-1]):
            here = parent + (comp,)
            if here not in made:
                steps.append((True, made[parent], comp, "/".join(key.split("/")[:depth + 1])))
                made[here] = len(made)
            parent = here
        steps.append((False, made[parent], comps[-1], key))
    return tuple(steps)


def _plan(paths: Mapping[str, tuple[str, ...]]) -> tuple[_Step, ...]:
    """``_steps`` of a layout ``names.layout`` gave (it shares one among the records of one set of
    keys), remembered for the last 1,024 of them (a memo of a pure function: it changes no result)."""
    got = _PLANS.get(id(paths))
    if got is not None and got[0] is paths:   # (the entry holds ``paths``: its id is not reused)
        return got[1]
    if len(_PLANS) >= 1 << 10:
        _PLANS.clear()
    plan = _steps(paths)
    _PLANS[id(paths)] = (paths, plan)
    return plan


def _written_name(shown: Shown | None, view: codec.View, comps: tuple[str, ...]) -> str:
    """The name (other than its own) a file shown at ``comps`` is found by, as written through
    (``NamePin.keep_written``): only a file whose bytes are the value (no JSON, no PNG of raw
    pixels), in the folder it was written in."""
    if shown is None or not shown.written or shown.written == comps[-1] or shown.folders != comps[:-1]:
        return ""
    if not isinstance(view, codec.FileView) or ".json" in (view.suffix, names.split_suffix(shown.written)[1]) \
            or view.raw_shape is not None:
        return ""
    return shown.written


def _node(view: codec.View, xattrs: Mapping[str, bytes], mtime: int, damaged: str | None, loc: Loc) -> Node:
    if isinstance(view, codec.FileView):
        return DataFile(view.data, mtime, xattrs, damaged, loc)
    d = Dir(mtime_ns=mtime, xattrs=xattrs, loc=loc)
    for i, (name, item) in enumerate(view.items):
        # Inside a step's own N.list/ folder, a file is value i of that step, not step i.
        inner = Loc(loc.section, loc.key, i) if loc.item is None else Loc(loc.section, loc.key, loc.item, sub=i)
        d.children[name + item.suffix] = _node(item, xattrs, mtime, damaged, inner)
    return d


def _shown(view: codec.View, comps: tuple[str, ...], pinned: bool, written: str = "") -> Shown:
    name = comps[-1]
    stem = name[:len(name) - len(view.suffix)]
    if isinstance(view, codec.FileView):
        return Shown(comps[:-1], stem, view.raw_shape, None, pinned, written=written)
    subs = tuple((item, tuple(n for n, _ in v.items)) for item, v in view.items if isinstance(v, codec.DirView))
    return Shown(comps[:-1], stem, None, tuple(item for item, _ in view.items), pinned, sub_names=subs)


_LOCS: dict[tuple[str, str, bool], Loc] = {}


def feature_loc(section: str, key: str, raw: bool) -> Loc:
    """Where a feature shown as one file or folder comes from. Interned as ``key_xattrs`` are
    (a memo of a pure function, bounded, that changes no result)."""
    got = _LOCS.get((section, key, raw))
    if got is None:
        if len(_LOCS) >= 1 << 14:
            _LOCS.clear()
        got = _LOCS[(section, key, raw)] = Loc(section, key, None, raw)
    return got


_XATTRS: dict[tuple[str, str | None, bool], Mapping[str, bytes]] = {}
RAW_XATTR = "user.tfrfs.shown"   # "raw pixels" on a PNG drawn from a raw pixel array (3.3)


def key_xattrs(key: str, kind: str | None, raw: bool = False) -> Mapping[str, bytes]:
    """The xattrs of a feature (key and kind; ``raw``: its PNG is drawn from raw pixels, which
    a copy kept with ``cp -a`` tells ``tfrfs pack``) or of a nested-key folder (key). Interned:
    most records of a dataset have the same keys, so their views share one mapping per key (a
    memo of a pure function, bounded, that changes no result)."""
    got = _XATTRS.get((key, kind, raw))
    if got is None:
        attrs = {"user.tfrfs.key": key.encode("utf-8", "surrogatepass")}
        if kind is not None:
            attrs["user.tfrfs.kind"] = kind.encode()
        if raw:
            attrs[RAW_XATTR] = b"raw pixels"
        if len(_XATTRS) >= 1 << 14:
            _XATTRS.clear()
        got = _XATTRS[(key, kind, raw)] = MappingProxyType(attrs)
    return got


def _bytes_held(d: Dir) -> int:
    """The bytes a record's view holds (images left in the shard hold none)."""
    n = 0
    for child in d.children.values():
        if isinstance(child, Dir):
            n += 64 + _bytes_held(child)
        elif isinstance(child, DataFile) and isinstance(child.data, bytes):
            n += 64 + len(child.data)
    return n
