"""Names inside a record stay stable until a commit (SPEC 7), in process (no FUSE).

A change to a record renames none of the features it leaves alone: a raw pixel array whose
height went stays ``.png``; the items after a removed ``.list/`` item or ``.steps/`` step keep
their numbers, and a folder left with one value (or none) stays a folder until ``rmdir``; a name
shortened for a clash keeps its shortening when the other feature goes. The next mount shows
the staged content by the SPEC rules; a commit writes exactly what was asked for.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator

import pytest
from PIL import Image

from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.view.nodes import DataFile

from inprocess import Session
from support import reference


def _jpeg(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(buf, format="JPEG")
    return buf.getvalue()


JPG = _jpeg((10, 20, 30))
PIXELS = bytes(range(6))          # 2 x 3, one channel
ITEMS = (JPG, b"\x00one", b"\x00two", b"\x00three")
STEPS = tuple(_jpeg((40 * i, 0, 0)) for i in range(4))


def _set(feats: Any, key: str, kind: str, *vals: Any) -> None:
    codec.value_to_proto(codec.Value(kind, tuple(vals)), feats[key])


def example() -> proto.Example:
    m = proto.Example()
    f = m.features.feature
    _set(f, "a", "int64_list", 1)
    _set(f, "a.json/x", "int64_list", 2)        # folder a.json/ clashes with a's file a.json
    _set(f, "image_raw", "bytes_list", PIXELS)
    _set(f, "height", "int64_list", 2)
    _set(f, "width", "int64_list", 3)
    _set(f, "items", "bytes_list", *ITEMS)
    return m


def sequence() -> proto.SequenceExample:
    m = proto.SequenceExample()
    _set(m.context.feature, "id", "bytes_list", b"clip")
    lists = m.feature_lists.feature_list
    for step in STEPS:
        codec.value_to_proto(codec.Value("bytes_list", (step,)), lists["jpeg"].feature.add())
    for n in range(3):
        codec.value_to_proto(codec.Value("int64_list", (n,)), lists["n"].feature.add())
    return m


def write_shard(path: Path, records: list[Any]) -> None:
    with open(path, "wb") as f:
        w = tfrecord.StreamWriter(f)
        for r in records:
            w.write(r.SerializeToString(deterministic=True))
        w.close()


class Source:
    """The test's dataset; calling it mounts it (in process), as the next mount would."""

    def __init__(self, src: Path, cache: Path) -> None:
        self.src = src
        self.cache = cache
        self.opened: list[Session] = []

    def __call__(self) -> Session:
        s = Session(self.src, self.cache)
        self.opened.append(s)
        return s


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Source]:
    src = tmp_path / "src"
    src.mkdir()
    write_shard(src / "ex.tfrecord", [example(), example()])
    write_shard(src / "seq.tfrecord", [sequence(), sequence()])
    source = Source(src, tmp_path / "cache")
    yield source
    for s in source.opened:
        try:
            s.close()
        except OSError:
            pass    # closed by the test already


def listing(s: Session, path: str) -> list[str]:
    return sorted(name for name, _ in s.tree.names(s.tree.lookup(path)))


def read(s: Session, path: str) -> bytes:
    node = s.tree.lookup(path)
    assert isinstance(node, DataFile), path
    return node.data


def committed(src: Path, shard: str) -> list[Any]:
    """The committed shard's records, read by the test suite's own reader, as ``read`` gives them."""
    return as_read(*reference.written_records(src / shard), seq=shard.startswith("seq"))


def as_read(*records: Any, seq: bool = False) -> list[Any]:
    """Records (bytes, or messages built here) as the reference reader parses them: compared so,
    a record tfrfs wrote equals the message it should hold whatever order its fields are in."""
    parse = reference.parse_sequence_example if seq else reference.parse_example
    return [parse(r if isinstance(r, bytes) else r.SerializeToString()) for r in records]


def test_rm_r_of_every_record_works(mount: Source) -> None:
    """rm -r lists a folder, then removes its entries by those names: none may have moved."""
    s = mount()
    for path in ("/ex.tfrecord/000000", "/seq.tfrecord/000001"):
        s.rm_r(path)
    assert listing(s, "/ex.tfrecord") == ["000001"] and listing(s, "/seq.tfrecord") == ["000000"]
    s.commit()
    assert committed(mount.src, "ex.tfrecord") == as_read(example())
    assert committed(mount.src, "seq.tfrecord") == as_read(sequence(), seq=True)


def test_a_name_shortened_for_a_clash_stays_when_the_other_feature_goes(mount: Source) -> None:
    s = mount()
    rec = "/ex.tfrecord/000000"
    folder = next(n for n in listing(s, rec) if n.startswith("a.json~"))
    s.unlink(f"{rec}/a.json")
    assert folder in listing(s, rec) and "a.json" not in listing(s, rec)
    assert read(s, f"{rec}/{folder}/x.json") == b"[2]\n"
    s.commit()
    assert listing(s, rec)[:2] == ["a.json", "height.json"]     # the rules again: no clash left
    assert read(s, f"{rec}/a.json/x.json") == b"[2]\n"


def test_raw_pixels_keep_their_png_until_the_commit(mount: Source) -> None:
    s = mount()
    rec = "/ex.tfrecord/000000"
    png = read(s, f"{rec}/image_raw.png")
    s.unlink(f"{rec}/width.json")
    assert read(s, f"{rec}/image_raw.png") == png
    # A change elsewhere in the record keeps it so too.
    s.write(f"{rec}/height.json", b"[5]\n")
    s.write(f"{rec}/note.txt", b"hello")
    assert read(s, f"{rec}/image_raw.png") == png
    with Image.open(io.BytesIO(png)) as img:
        assert img.size == (3, 2) and img.tobytes() == PIXELS
    # Writing another picture changes its value (and height): shown by the rules then, and
    # without a width that is its raw bytes.
    buf = io.BytesIO()
    Image.new("L", (3, 2), 0).save(buf, format="PNG")
    s.write(f"{rec}/image_raw.png", buf.getvalue())
    assert read(s, f"{rec}/image_raw.bin") == bytes(6)
    s.commit()
    m = example()
    del m.features.feature["width"]
    _set(m.features.feature, "height", "int64_list", 2)
    _set(m.features.feature, "image_raw", "bytes_list", bytes(6))
    _set(m.features.feature, "note", "bytes_list", b"hello")
    assert committed(mount.src, "ex.tfrecord") == as_read(m, example())


def test_list_items_keep_their_numbers(mount: Source) -> None:
    s = mount()
    folder = "/ex.tfrecord/000000/items.list"
    assert listing(s, folder) == ["0.jpg", "1.bin", "2.bin", "3.bin"]
    s.unlink(f"{folder}/0.jpg")
    s.unlink(f"{folder}/2.bin")
    assert listing(s, folder) == ["1.bin", "3.bin"]
    assert read(s, f"{folder}/3.bin") == ITEMS[3]
    s.write(f"{folder}/7.txt", b"last")             # after 3, with no empty values made up
    s.write(f"{folder}/0.txt", b"first")            # before 1
    s.write(f"{folder}/2.txt", b"between")          # between 1 and 3
    s.write(f"{folder}/3.bin", b"\x00new three")    # that item, whatever its position
    assert [(n, read(s, f"{folder}/{n}")) for n in listing(s, folder)] == [
        ("0.txt", b"first"), ("1.bin", ITEMS[1]), ("2.txt", b"between"), ("3.bin", b"\x00new three"),
        ("7.txt", b"last")]
    s.commit()
    assert listing(s, folder) == ["0.txt", "1.bin", "2.txt", "3.bin", "4.txt"]
    m = example()
    _set(m.features.feature, "items", "bytes_list", b"first", ITEMS[1], b"between", b"\x00new three", b"last")
    assert committed(mount.src, "ex.tfrecord") == as_read(m, example())


def test_an_item_after_the_last_makes_up_no_values(mount: Source) -> None:
    """A folder holds the values of its files in name order: writing 5.bin beside 0..3 adds one value."""
    s = mount()
    folder = "/ex.tfrecord/000001/items.list"
    s.write(f"{folder}/5.bin", b"\x00five")
    assert listing(s, folder) == ["0.jpg", "1.bin", "2.bin", "3.bin", "5.bin"]
    s.commit()
    assert listing(s, folder) == ["0.jpg", "1.bin", "2.bin", "3.bin", "4.bin"]
    m = example()
    _set(m.features.feature, "items", "bytes_list", *ITEMS, b"\x00five")
    assert committed(mount.src, "ex.tfrecord") == as_read(example(), m)


def copy_tree(s: Session, src: str, dst: str) -> None:
    """What cp -r does: mkdir each folder, write each file, in listing order."""
    s.mkdir(dst)
    for name, is_dir in s.tree.names(s.tree.lookup(src)):
        if is_dir:
            copy_tree(s, f"{src}/{name}", f"{dst}/{name}")
        else:
            s.write(f"{dst}/{name}", read(s, f"{src}/{name}"))


def test_a_copy_made_before_the_commit_is_equal(mount: Source) -> None:
    """cp -r of a record whose list has gaps in its numbers (an item removed), and whose raw pixels
    lost their width, gives the same record: files out of order or with gaps make up no values."""
    s = mount()
    rec = "/ex.tfrecord/000000"
    s.unlink(f"{rec}/items.list/0.jpg")
    s.unlink(f"{rec}/items.list/2.bin")
    s.unlink(f"{rec}/width.json")
    s.rm_r(f"{rec}/{next(n for n in listing(s, rec) if n.startswith('a.json~'))}")   # a shortened name
    copy_tree(s, rec, "/ex.tfrecord/copy")
    assert listing(s, "/ex.tfrecord/copy/items.list") == ["1.bin", "3.bin"]
    s.mkdir("/ex.tfrecord/late")
    s.mkdir("/ex.tfrecord/late/items.list")
    for name in ("11.bin", "03.bin", "07.txt"):
        s.write(f"/ex.tfrecord/late/items.list/{name}", name.encode() + b"\x00")
    assert listing(s, "/ex.tfrecord/late/items.list") == ["03.bin", "07.bin", "11.bin"]
    s.commit()
    records = committed(mount.src, "ex.tfrecord")
    assert records[0] == records[2]
    assert records[0]["items"][1] == [ITEMS[1], ITEMS[3]]
    assert records[3]["items"][1] == [b"03.bin\x00", b"07.txt\x00", b"11.bin\x00"]


def test_emptied_folders_stay_until_rmdir(mount: Source) -> None:
    s = mount()
    rec = "/ex.tfrecord/000000"
    for name in listing(s, f"{rec}/items.list"):
        s.unlink(f"{rec}/items.list/{name}")
        if name != "3.bin":
            # One value left is still a folder (the rules would show items.bin).
            assert "items.list" in listing(s, rec) and "items.bin" not in listing(s, rec)
    assert listing(s, f"{rec}/items.list") == []
    s.rmdir(f"{rec}/items.list")
    assert not any(n.startswith("items") for n in listing(s, rec))
    seq = "/seq.tfrecord/000000/feature_lists"
    for name in ("0.jpg", "1.jpg", "2.jpg", "3.jpg"):
        s.unlink(f"{seq}/jpeg.steps/{name}")
    assert listing(s, seq) == ["jpeg.steps", "n.json"] and listing(s, f"{seq}/jpeg.steps") == []
    s.rmdir(f"{seq}/jpeg.steps")
    assert listing(s, seq) == ["n.json"]
    s.commit()
    m = example()
    del m.features.feature["items"]
    q = sequence()
    del q.feature_lists.feature_list["jpeg"]
    assert committed(mount.src, "ex.tfrecord") == as_read(m, example())
    assert committed(mount.src, "seq.tfrecord") == as_read(q, sequence(), seq=True)


def test_steps_keep_their_numbers_and_folder(mount: Source) -> None:
    s = mount()
    folder = "/seq.tfrecord/000000/feature_lists/jpeg.steps"
    s.unlink(f"{folder}/0.jpg")
    s.unlink(f"{folder}/2.jpg")
    assert [(n, read(s, f"{folder}/{n}")) for n in listing(s, folder)] == [("1.jpg", STEPS[1]), ("3.jpg", STEPS[3])]
    s.write(f"{folder}/0.txt", b"first")      # before 1
    assert listing(s, folder) == ["0.txt", "1.jpg", "3.jpg"]
    s.commit()
    q = sequence()
    flist = q.feature_lists.feature_list["jpeg"]
    del flist.feature[:]
    codec.value_to_proto(codec.Value("bytes_list", (b"first",)), flist.feature.add())
    for step in (STEPS[1], STEPS[3]):
        codec.value_to_proto(codec.Value("bytes_list", (step,)), flist.feature.add())
    assert committed(mount.src, "seq.tfrecord") == as_read(q, sequence(), seq=True)


def test_the_next_mount_shows_the_staged_content_by_the_rules(mount: Source) -> None:
    s = mount()
    rec = "/ex.tfrecord/000000"
    png = read(s, f"{rec}/image_raw.png")
    s.unlink(f"{rec}/height.json")
    s.unlink(f"{rec}/items.list/0.jpg")
    s.unlink(f"{rec}/a.json")
    s.unlink("/seq.tfrecord/000000/feature_lists/jpeg.steps/0.jpg")
    for name in ("0.jpg", "1.bin", "2.bin", "3.bin"):
        s.unlink(f"/ex.tfrecord/000001/items.list/{name}")
    assert "image_raw.png" in listing(s, rec) and read(s, f"{rec}/image_raw.png") == png
    s.close()     # no commit: the changes stay staged
    s = mount()
    # Renumbered and re-suffixed by the rules; the emptied folder is still there, empty.
    assert listing(s, rec) == ["a.json", "image_raw.bin", "items.list", "width.json"]
    assert listing(s, f"{rec}/items.list") == ["0.bin", "1.bin", "2.bin"]
    assert listing(s, "/seq.tfrecord/000000/feature_lists/jpeg.steps") == ["0.jpg", "1.jpg", "2.jpg"]
    assert "items.list" in listing(s, "/ex.tfrecord/000001")
    assert listing(s, "/ex.tfrecord/000001/items.list") == []
    # ... and rm -r works on what it shows.
    s.rm_r("/ex.tfrecord/000001")
    s.commit()
    m = example()
    for key in ("height", "a"):
        del m.features.feature[key]
    _set(m.features.feature, "items", "bytes_list", *ITEMS[1:])
    assert committed(mount.src, "ex.tfrecord") == as_read(m)


def test_a_new_record_of_a_removed_ones_name_starts_afresh(mount: Source) -> None:
    s = mount()
    s.mkdir("/ex.tfrecord/new")
    s.mkdir("/ex.tfrecord/new/items.list")
    s.write("/ex.tfrecord/new/items.list/0.bin", b"\x00a")
    s.write("/ex.tfrecord/new/items.list/1.bin", b"\x00b")
    s.write("/ex.tfrecord/new/items.list/2.bin", b"\x00c")
    s.unlink("/ex.tfrecord/new/items.list/0.bin")
    assert listing(s, "/ex.tfrecord/new/items.list") == ["1.bin", "2.bin"]
    s.rm_r("/ex.tfrecord/new")
    s.mkdir("/ex.tfrecord/new")
    s.mkdir("/ex.tfrecord/new/items.list")
    s.write("/ex.tfrecord/new/items.list/0.bin", b"\x00x")
    s.write("/ex.tfrecord/new/items.list/1.bin", b"\x00y")
    assert listing(s, "/ex.tfrecord/new/items.list") == ["0.bin", "1.bin"]
