"""Feature key <-> path inside a record folder (SPEC 3.1).

A key is split on ``/`` into nested folders unless that gives an empty component, ``.`` or
``..``; then it stays one component with each ``/`` written ``%2F``. In every component ``%``,
bytes below 0x20, 0x7F and a leading ``.`` are written ``%XX`` (UTF-8, upper-case hex); the empty
key is ``%`` alone. The file of a key is its last component plus the suffix from ``codec``.

Shortening and clashes (``layout``). A name may be at most 255 UTF-8 bytes. A longer one is cut,
at a character boundary and never inside a ``%XX`` escape, to a prefix + ``~`` + the first 8 hex
digits of SHA-256 of the key it stands for (for a folder: the key's components up to and
including that folder, joined by ``/``) + the suffix. Two keys can still want the same name in
one folder: a file and a nested-key folder (key ``a`` shown as ``a.json`` and key ``a.json/x``
needing a folder ``a.json``), a nested-key folder and a ``.list``/``.steps`` folder, or any name
and a shortened one. The rule, applied the same way in every record so a listing is
deterministic:

* keys are placed in sorted order (Python ``str`` order, i.e. by code point), folder components
  before the file, and each name goes to the first key that claims it;
* a later key that finds its name taken by a different key gets the hashed name above (cut only
  if it would pass 255 bytes);
* should that be taken too (a 32-bit hash collision, or a key spelt like a hashed name), the hash
  grows to 16, 32, then 64 hex digits, then a counter is added.

Nested keys that share a folder (``image/encoded``, ``image/height``) share it; it is not a clash.
"""

from __future__ import annotations

import hashlib
import re
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Sequence

from tfrfs.format import codec
from tfrfs.errors import Invalid, NameTooLong

NAME_MAX = 255

# What SPEC 3.1 escapes, plus '/', which only survives into a component when the key is kept
# whole (and then must be written %2F); a regex here runs once per name, not per value.
_ESCAPE = re.compile(r"[\x00-\x1f\x7f%/]|^\.")
_HEX = frozenset("0123456789ABCDEFabcdef")
_ALL_SUFFIXES = codec.SUFFIXES | frozenset(codec.DIR_SUFFIXES)
_UNSPLITTABLE = frozenset(("", ".", ".."))
_HASH_LENGTHS = (8, 16, 32, 64)
_HASHED = re.compile(r"~([0-9a-f]{8}|[0-9a-f]{16}|[0-9a-f]{32}|[0-9a-f]{64})$")   # a stem as _hashed_names ends it


def _escape(match: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in match.group().encode("utf-8"))


def encode_component(part: str) -> str:
    """One key component as a name: ``%XX`` for ``%``, controls, 0x7F, ``/``, a leading dot."""
    if not part:
        return "%"
    if _ESCAPE.search(part) is None:
        return part
    return _ESCAPE.sub(_escape, part)


def decode_component(name: str) -> str:
    """The key component a name stands for (inverse of ``encode_component``).

    Raises ``errors.Invalid`` for a ``%`` not followed by two hex digits or escapes that do not
    make UTF-8.
    """
    if name == "%":
        return ""
    if "%" not in name:
        return name
    first, *chunks = name.split("%")
    out = bytearray(first.encode("utf-8"))
    for chunk in chunks:
        if len(chunk) < 2 or chunk[0] not in _HEX or chunk[1] not in _HEX:
            raise Invalid(f"{name!r}: '%' must start an escape of two hex digits (write '%' as %25)")
        out.append(int(chunk[:2], 16))
        out += chunk[2:].encode("utf-8")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid(f"{name!r}: its %XX escapes do not make UTF-8 text") from None


def _parts(key: str) -> list[str]:
    """The raw (unescaped) components of a key."""
    parts = key.split("/")
    if len(parts) > 1 and not _UNSPLITTABLE.isdisjoint(parts):
        return [key]
    return parts


def key_components(key: str) -> tuple[str, ...]:
    """The path components of a key (before shortening), the last one without its suffix."""
    return tuple(map(encode_component, _parts(key)))


def split_suffix(name: str) -> tuple[str, str | None]:
    """``("image", ".jpg")`` for ``image.jpg``; ``(name, None)`` when the last suffix is not ours."""
    dot = name.rfind(".")
    if dot >= 0 and name[dot:] in _ALL_SUFFIXES:
        return name[:dot], name[dot:]
    return name, None


def is_scratch(name: str) -> bool:
    """A user's scratch file (editor swap and backup files): never a feature (SPEC 7)."""
    return name.startswith(".") or name.endswith("~")


def _byte_len(name: str) -> int:
    # Every character is at most 4 UTF-8 bytes: short names need no encoding to be measured.
    return len(name) if len(name) * 4 <= NAME_MAX else len(name.encode("utf-8"))


def _cut(component: str, budget: int) -> str:
    """The longest prefix of an encoded component within ``budget`` bytes, not splitting %XX."""
    used = 0
    end = 0
    for ch in component:
        size = len(ch.encode("utf-8"))
        if used + size > budget:
            break
        used += size
        end += 1
    prefix = component[:end]
    # Every '%' in an encoded component starts a three-character escape (a lone '%' is only
    # the empty key, never cut): drop an escape the cut went through.
    if prefix.endswith("%"):
        prefix = prefix[:-1]
    elif len(prefix) >= 2 and prefix[-2] == "%":
        prefix = prefix[:-2]
    return prefix


def _hashed_names(component: str, suffix: str, source: str) -> list[str]:
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    names = []
    for n in _HASH_LENGTHS:
        tail = f"~{digest[:n]}{suffix}"
        names.append(_cut(component, NAME_MAX - len(tail.encode("utf-8"))) + tail)
    return names


def _claim(taken: set[str], component: str, suffix: str, source: str) -> str:
    """A free name in one folder for ``source`` (the key, or key prefix, the name stands for)."""
    natural = component + suffix
    if natural not in taken and _byte_len(natural) <= NAME_MAX:
        taken.add(natural)
        return natural
    candidates = _hashed_names(component, suffix, source)
    for name in candidates:
        if name not in taken:
            taken.add(name)
            return name
    longest = candidates[-1]
    stem = longest[:len(longest) - len(suffix)] if suffix else longest
    n = 1
    while True:  # every SHA-256 digit agreed: only a key spelt like this name gets here
        tail = f"~{n}{suffix}"
        name = _cut(stem, NAME_MAX - len(tail.encode("utf-8"))) + tail
        if name not in taken:
            taken.add(name)
            return name
        n += 1


_LAYOUTS: dict[tuple[tuple[str, str], ...], Mapping[str, tuple[str, ...]]] = {}
_LAYOUTS_MAX = 4096


def layout(entries: Sequence[tuple[str, str]]) -> Mapping[str, tuple[str, ...]]:
    """Path components of every feature of one record folder, relative to that folder.

    ``entries`` are ``(key, suffix)`` for every feature (suffix ``.list``/``.steps`` for a
    feature shown as a folder). The last component of each path includes the suffix. Names are
    at most 255 bytes and unique; the module docstring gives the rule for clashes.

    The records of a dataset mostly share one set of keys and suffixes, so layouts are
    remembered (the result is shared: read it, do not change it).
    """
    sig = tuple(sorted(entries))
    hit = _LAYOUTS.get(sig)
    if hit is None:
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.clear()
        hit = _LAYOUTS[sig] = MappingProxyType(_layout(sig))
    return hit


def _layout(entries: Sequence[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    result: dict[str, tuple[str, ...]] = {}
    # Names given out in each folder. A nested-key folder is claimed once, by the first key
    # under it; later keys find it in `folders`, so sharing it is never seen as a clash.
    taken: dict[tuple[str, ...], set[str]] = {}
    folders: dict[str, tuple[str, ...]] = {}  # key prefix -> its folder's path
    for key, suffix in entries:
        if key in result:
            raise ValueError(f"key {key!r} given twice")
        parts = _parts(key)
        parent: tuple[str, ...] = ()
        for depth in range(len(parts) - 1):
            prefix = "/".join(parts[:depth + 1])
            path = folders.get(prefix)
            if path is None:
                names = taken.setdefault(parent, set())
                name = _claim(names, encode_component(parts[depth]), "", prefix)
                path = folders[prefix] = parent + (name,)
            parent = path
        names = taken.setdefault(parent, set())
        name = _claim(names, encode_component(parts[-1]), suffix, key)
        result[key] = parent + (name,)
    return result


def path_to_key(components: Sequence[str], known: Callable[[], Iterable[str]] | None = None) -> tuple[str, str | None]:
    """The key and suffix a NEW path inside a record folder stands for.

    A shortened (hashed) name stands for the key it was made from (SPEC 3.1), a folder's for its
    part of the key: ``known`` gives the dataset's keys to find it among (asked only when a name
    looks shortened). A name that no known key was shortened to is a key of its own.

    Raises ``errors.NameTooLong`` for a component over 255 bytes and ``errors.Invalid`` for a
    path no key is shown as (a bad escape, or a spelling such as ``a%2Fb.json`` for the key
    ``a/b``, which is shown as ``a/b.json``): accepting those would show the new feature under
    another name than the one just created.
    """
    if not components:
        raise Invalid("an empty path names no feature")
    for name in components:
        if _byte_len(name) > NAME_MAX:
            raise NameTooLong(f"{name[:40]!r}...: a name is at most {NAME_MAX} bytes")
    stem, suffix = split_suffix(components[-1])
    names = (*components[:-1], stem)
    parts: list[str | None] = [None] * len(names)   # key parts found behind shortened names
    if known is not None and any(_HASHED.search(n) for n in names):
        parts = _shortened_parts(components, suffix or "", known())
    key = "/".join(p if p is not None else decode_component(n) for p, n in zip(parts, names))
    written = key_components(key)
    if len(written) != len(names) or any(p is None and w != n for p, w, n in zip(parts, written, names)):
        shown = "/".join(written)
        raise Invalid(f"{'/'.join(names)!r} is not how a key is written; the key {key!r} "
                      f"is written {shown!r}")
    return key, suffix


def _shortened_parts(components: Sequence[str], suffix: str, keys: Iterable[str]) -> list[str | None]:
    """For each component of a path, the key part it stands for when it is a shortened name of a
    known key (a folder's: of a part of one; the last: of a whole key), else None. The folders are
    read first: a file's key must lie under the parts found for them."""
    depth = len(components)
    split = [_parts(k) for k in keys]
    found: list[str | None] = [None] * depth
    for d, name in enumerate(components):
        last = d == depth - 1
        stem = name[:len(name) - len(suffix)] if last and suffix else name
        if not _HASHED.search(stem):
            continue
        for p in split:
            if (len(p) != depth) if last else len(p) < d + 2:
                continue
            if any(p[i] != found[i] if found[i] is not None else encode_component(p[i]) != components[i]
                   for i in range(d)):
                continue
            source = "/".join(p) if last else "/".join(p[:d + 1])
            if name in _hashed_names(encode_component(p[d]), suffix if last else "", source):
                found[d] = p[d]
                break
    return found
