"""Unit and property tests of tfrfs.format.names (SPEC 3.1)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tfrfs import errors
from tfrfs.format import names
from tfrfs.format.names import NAME_MAX


def h8(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def nbytes(name: str) -> int:
    return len(name.encode("utf-8"))


@pytest.mark.parametrize("key, components", [
    ("image/encoded", ("image", "encoded")),
    ("a/b/c", ("a", "b", "c")),
    ("label", ("label",)),
    ("", ("%",)),
    ("a//b", ("a%2F%2Fb",)),  # empty component: kept whole
    ("/a", ("%2Fa",)),
    ("a/", ("a%2F",)),
    ("/", ("%2F",)),
    ("a/./b", ("a%2F.%2Fb",)),  # '.' component: kept whole
    ("a/../b", ("a%2F..%2Fb",)),
    (".", ("%2E",)),
    ("..", ("%2E.",)),
    ("./x", ("%2E%2Fx",)),
    (".hidden", ("%2Ehidden",)),  # a leading dot is escaped, so dot names stay the user's
    ("a/.b", ("a", "%2Eb")),
    ("a.b.", ("a.b.",)),
    ("50%", ("50%25",)),
    ("tab\there\n", ("tab%09here%0A",)),
    ("nul\x00del\x7f", ("nul%00del%7F",)),
    ("Zoë~ 日本", ("Zoë~ 日本",)),
    ("%", ("%25",)),
])
def test_key_components(key: str, components: tuple[str, ...]) -> None:
    assert names.key_components(key) == components
    last = components[-1] + ".json"
    assert names.path_to_key((*components[:-1], last)) == (key, ".json")


@pytest.mark.parametrize("part", ["", "a", "%", "%%", ".", "..", ".a.", "a/b", "\x01\x1f\x7f", "é%2F"])
def test_encode_decode_inverse(part: str) -> None:
    encoded = names.encode_component(part)
    assert "/" not in encoded and "\x00" not in encoded and not encoded.startswith(".")
    assert names.decode_component(encoded) == part


def test_encode_uses_upper_case_hex_of_utf8() -> None:
    assert names.encode_component("\x1b") == "%1B"
    assert names.encode_component(".x") == "%2Ex"


@pytest.mark.parametrize("name", ["a%", "a%4", "a%G0", "%+1x", "%C3", "% 1"])
def test_decode_rejects_bad_escapes(name: str) -> None:
    with pytest.raises(errors.Invalid):
        names.decode_component(name)


@pytest.mark.parametrize("name, expected", [
    ("image.jpg", ("image", ".jpg")),
    ("a.json.json", ("a.json", ".json")),
    ("x.list", ("x", ".list")),
    ("x.steps", ("x", ".steps")),
    ("x.tar.gz", ("x.tar.gz", None)),
    ("x.JPG", ("x.JPG", None)),
    ("noext", ("noext", None)),
    ("%.txt", ("%", ".txt")),
])
def test_split_suffix(name: str, expected: tuple[str, str | None]) -> None:
    assert names.split_suffix(name) == expected


def test_is_scratch() -> None:
    assert names.is_scratch(".swp") and names.is_scratch("a.json~") and names.is_scratch(".#x")
    assert not names.is_scratch("a.json") and not names.is_scratch("%2Ea.txt")


@pytest.mark.parametrize("components", [
    ("a%2Fb.json",),  # the key a/b is shown as a/b.json
    ("%2E", "b.json"),  # ./b is kept whole: %2E%2Fb.json
    ("a%41.json",),  # not canonical: "aA.json"
    ("a%2e.json",),  # lower-case hex
    ("a%.json",),  # bad escape
    (".json",),  # empty stem is not the empty key (that is %.json)
    ("",),
    (),
])
def test_path_to_key_rejects_names_no_key_has(components: tuple[str, ...]) -> None:
    with pytest.raises(errors.Invalid):
        names.path_to_key(components)


def test_path_to_key_without_suffix_and_too_long() -> None:
    assert names.path_to_key(("image", "encoded")) == ("image/encoded", None)
    assert names.path_to_key(("%.json",)) == ("", ".json")
    with pytest.raises(errors.NameTooLong):
        names.path_to_key(("a" * 256,))


# --- layout: the 255-byte limit and clashes ---------------------------------------------------


def test_layout_plain() -> None:
    got = names.layout([("image/encoded", ".jpg"), ("image/height", ".json"), ("label", ".json"),
                        ("tags", ".list")])
    assert got == {"image/encoded": ("image", "encoded.jpg"), "image/height": ("image", "height.json"),
                   "label": ("label.json",), "tags": ("tags.list",)}


def test_layout_shortens_long_file_name_with_multibyte_chars() -> None:
    key = "é" * 200  # 400 bytes
    (name,) = names.layout([(key, ".json")])[key]
    assert name.endswith(f"~{h8(key)}.json")
    assert nbytes(name) <= NAME_MAX and nbytes(name) >= NAME_MAX - 1  # cut at a character boundary
    prefix = name[: -len(f"~{h8(key)}.json")]
    assert key.startswith(prefix)


def test_layout_shortening_never_splits_an_escape() -> None:
    for pad in range(4):
        key = "a" * (240 + pad) + "%" * 20
        (name,) = names.layout([(key, ".json")])[key]
        stem = name[: -len(f"~{h8(key)}.json")]
        assert nbytes(name) <= NAME_MAX
        assert names.decode_component(stem) == key[: len(names.decode_component(stem))]


def test_layout_shortens_folder_with_hash_of_its_part_of_the_key() -> None:
    folder = "d" * 300
    got = names.layout([(f"{folder}/a", ".json"), (f"{folder}/b", ".txt")])
    assert got[f"{folder}/a"][0] == got[f"{folder}/b"][0]  # both keys share the one folder
    assert got[f"{folder}/a"][0] == "d" * (NAME_MAX - 9) + f"~{h8(folder)}"
    assert got[f"{folder}/a"][1:] == ("a.json",) and got[f"{folder}/b"][1:] == ("b.txt",)


def test_layout_exactly_255_bytes_is_not_cut() -> None:
    key = "k" * (NAME_MAX - len(".json"))
    assert names.layout([(key, ".json")]) == {key: (key + ".json",)}
    key2 = key + "k"
    assert names.layout([(key2, ".json")])[key2][0].endswith(f"~{h8(key2)}.json")


def test_layout_clash_file_vs_folder() -> None:
    got = names.layout([("a.json/x", ".json"), ("a", ".json")])
    assert got == {"a": ("a.json",), "a.json/x": (f"a.json~{h8('a.json')}", "x.json")}


def test_layout_clash_nested_folder_vs_list_folder() -> None:
    got = names.layout([("a.list/0", ".txt"), ("a", ".list")])
    assert got == {"a": ("a.list",), "a.list/0": (f"a.list~{h8('a.list')}", "0.txt")}
    got = names.layout([("s.steps/1", ".json"), ("s", ".steps")])
    assert got["s"] == ("s.steps",) and got["s.steps/1"][0] == f"s.steps~{h8('s.steps')}"


def test_layout_clash_file_vs_file() -> None:
    long_key = "x" * 300
    short = names.layout([(long_key, ".txt")])[long_key][0]
    squatter = short[: -len(".txt")]  # a key spelt exactly like the shortened name
    got = names.layout([(long_key, ".txt"), (squatter, ".txt")])
    assert len(set(got.values())) == 2
    first, second = sorted([long_key, squatter])
    assert got[first] == (short if first == long_key else squatter + ".txt",)
    assert got[second][0].endswith(".txt") and "~" in got[second][0]


def test_layout_is_deterministic() -> None:
    entries = [("a.json/x", ".json"), ("a", ".json"), ("b", ".list"), ("b.list/y", ".bin")]
    assert names.layout(entries) == names.layout(list(reversed(entries)))


def test_layout_rejects_duplicate_keys() -> None:
    with pytest.raises(ValueError):
        names.layout([("a", ".json"), ("a", ".txt")])


# --- properties ---------------------------------------------------------------------------------

SUFFIX = st.sampled_from([".json", ".txt", ".jpg", ".bin", ".list", ".steps", ".png"])
SHORT = st.text(alphabet="ab./%~é\x01", max_size=10)
LONG = st.text(alphabet="a€/%.", min_size=60, max_size=300)


@st.composite
def clashing_entries(draw: st.DrawFn) -> dict[str, str]:
    """Entries where keys often fight for a name: "a" shown as a.json next to "a.json/x"."""
    entries = draw(st.dictionaries(st.one_of(st.text(alphabet="ab/", max_size=4), SHORT, LONG),
                                   SUFFIX, max_size=8))
    for key, suffix in list(entries.items()):
        if draw(st.booleans()):
            entries.setdefault(f"{key}{suffix}/{draw(SHORT)}", draw(SUFFIX))
    return entries


@given(st.text(), SUFFIX)
def test_key_path_identity(key: str, suffix: str) -> None:
    components = names.key_components(key)
    path = (*components[:-1], components[-1] + suffix)
    assume(all(nbytes(c) <= NAME_MAX for c in path))
    assert names.path_to_key(path) == (key, suffix)


@given(st.text())
def test_encode_decode_property(part: str) -> None:
    encoded = names.encode_component(part)
    assert names.decode_component(encoded) == part
    assert "/" not in encoded and "\x00" not in encoded and encoded not in ("", ".", "..")


@given(st.one_of(st.dictionaries(st.text(max_size=12), SUFFIX, max_size=12), clashing_entries()))
def test_layout_is_injective_and_valid(entries: dict[str, str]) -> None:
    got = names.layout(list(entries.items()))
    assert set(got) == set(entries)
    paths = list(got.values())
    assert len(set(paths)) == len(paths)
    files = set(paths)
    for path in paths:
        assert path[-1].endswith(entries[next(k for k, p in got.items() if p == path)])
        for depth, name in enumerate(path):
            assert 0 < nbytes(name) <= NAME_MAX
            assert "/" not in name and "\x00" not in name and name not in (".", "..")
            if depth < len(path) - 1:
                assert path[: depth + 1] not in files  # no file is used as a folder
    # keys without a clash or an overlong name keep their plain path
    for key, path in got.items():
        plain = names.key_components(key)
        plain = (*plain[:-1], plain[-1] + entries[key])
        if path != plain:
            assert any("~" in n for n in path)


def test_a_shortened_name_stands_for_the_key_it_was_made_from() -> None:
    """SPEC 3.1: a name shortened (or hashed for a clash) maps back to the dataset key it was made
    from, a folder's to its part of the key, also for a path made anew (cp -r without xattrs)."""
    long_key = "k" * 300
    long_folder = "d" * 300
    keys = [long_key, f"{long_folder}/leaf", f"{long_folder}/sub/x", "a", "a.json/x", "short"]
    entries = [(long_key, ".txt"), (f"{long_folder}/leaf", ".json"), (f"{long_folder}/sub/x", ".list"),
               ("a", ".json"), ("a.json/x", ".json"), ("short", ".json")]
    shown = names.layout(entries)
    for key, suffix in entries:
        assert names.path_to_key(shown[key], lambda: keys) == (key, suffix)
        # Without the dataset's keys, a shortened name is a key of its own.
        if "~" in "/".join(shown[key]):
            assert names.path_to_key(shown[key])[0] != key
    folder = shown[f"{long_folder}/leaf"][0]
    # A new key under a shortened folder: the folder stands for its part of the key.
    assert names.path_to_key((folder, "new.json"), lambda: keys) == (f"{long_folder}/new", ".json")
    assert names.path_to_key((folder, "sub", "y.bin"), lambda: keys) == (f"{long_folder}/sub/y", ".bin")
    # A name that looks shortened but stands for no known key is taken as it is written.
    assert names.path_to_key(("x~0123abcd.json",), lambda: keys) == ("x~0123abcd", ".json")
    # Keys are asked for only when a name looks shortened.
    assert names.path_to_key(("short.json",), lambda: pytest.fail("asked")) == ("short", ".json")
