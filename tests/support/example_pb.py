"""The test suite's own message classes for TensorFlow's ``Example`` and ``SequenceExample``, for
tests that read records tfrfs wrote and look at them as messages (``ex.features.feature[k]``)
rather than as the reference reader's plain values (``reference.parse_example``).

Independent of tfrfs's ``tfrfs.format.proto``: written here from TensorFlow's ``feature.proto``
and ``example.proto`` (field numbers, packed repeated scalars, the ``kind`` oneof, the maps), in a
descriptor pool of their own and a package of their own, so they are never tfrfs's classes nor
TensorFlow's, whichever of those a process has loaded. Only the protobuf runtime is shared."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "tfrfs_tests.tensorflow"
_F = descriptor_pb2.FieldDescriptorProto


def _message(fdp: Any, name: str, fields: list[tuple]) -> Any:
    """``fields``: (name, number, type, label, type name or "", packed, oneof index or None)."""
    msg = fdp.message_type.add()
    msg.name = name
    for fname, number, ftype, label, tname, packed, oneof in fields:
        f = msg.field.add()
        f.name, f.number, f.type, f.label = fname, number, ftype, label
        if tname:
            f.type_name = f".{PACKAGE}.{tname}"
        if packed:
            f.options.packed = True
        if oneof is not None:
            f.oneof_index = oneof
    return msg


def _map(fdp: Any, name: str, value: str) -> None:
    """``message NAME { map<string, VALUE> feature(_list) = 1; }``."""
    field = "feature" if value == "Feature" else "feature_list"
    msg = _message(fdp, name, [])
    entry = msg.nested_type.add()
    entry.name = "".join(p.capitalize() for p in field.split("_")) + "Entry"
    entry.options.map_entry = True
    k = entry.field.add()
    k.name, k.number, k.type, k.label = "key", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL
    v = entry.field.add()
    v.name, v.number, v.type, v.label, v.type_name = "value", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, f".{PACKAGE}.{value}"
    f = msg.field.add()
    f.name, f.number, f.type, f.label = field, 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED
    f.type_name = f".{PACKAGE}.{name}.{entry.name}"


def _classes() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(name="tfrfs_tests/example.proto", package=PACKAGE, syntax="proto3")
    rep, opt = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
    _message(fdp, "BytesList", [("value", 1, _F.TYPE_BYTES, rep, "", False, None)])
    _message(fdp, "FloatList", [("value", 1, _F.TYPE_FLOAT, rep, "", True, None)])
    _message(fdp, "Int64List", [("value", 1, _F.TYPE_INT64, rep, "", True, None)])
    feature = _message(fdp, "Feature", [("bytes_list", 1, _F.TYPE_MESSAGE, opt, "BytesList", False, 0),
                                        ("float_list", 2, _F.TYPE_MESSAGE, opt, "FloatList", False, 0),
                                        ("int64_list", 3, _F.TYPE_MESSAGE, opt, "Int64List", False, 0)])
    feature.oneof_decl.add().name = "kind"
    _map(fdp, "Features", "Feature")
    _message(fdp, "FeatureList", [("feature", 1, _F.TYPE_MESSAGE, rep, "Feature", False, None)])
    _map(fdp, "FeatureLists", "FeatureList")
    _message(fdp, "Example", [("features", 1, _F.TYPE_MESSAGE, opt, "Features", False, None)])
    _message(fdp, "SequenceExample", [("context", 1, _F.TYPE_MESSAGE, opt, "Features", False, None),
                                      ("feature_lists", 2, _F.TYPE_MESSAGE, opt, "FeatureLists", False, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    names = ("BytesList", "FloatList", "Int64List", "Feature", "Features", "FeatureList", "FeatureLists",
             "Example", "SequenceExample")
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{n}")) for n in names}


_C = _classes()
Feature = _C["Feature"]
Features = _C["Features"]
FeatureList = _C["FeatureList"]
Example = _C["Example"]
SequenceExample = _C["SequenceExample"]


def same(message: Any) -> Any:
    """A message built with other classes (tfrfs's, TensorFlow's) as one of these: through its
    bytes, so the two compare with ``==``."""
    cls = SequenceExample if message.DESCRIPTOR.name == "SequenceExample" else Example
    return cls.FromString(message.SerializeToString())
