"""Our own definitions of TensorFlow's ``Example`` and ``SequenceExample``.

The messages are built from a descriptor at import time, in a private
descriptor pool, so no generated code has to match the installed protobuf
runtime and nothing clashes with TensorFlow's own classes when both are
loaded in one process. Field numbers and types follow TensorFlow's
``example.proto`` and ``feature.proto`` exactly: that is the wire contract.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _field(msg: Any, name: str, number: int, ftype: int, *, repeated: bool = False,
           type_name: str = "", oneof: int | None = None, packed: bool = False) -> None:
    f = msg.field.add()
    f.name = name
    f.number = number
    f.type = ftype
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    if packed:
        f.options.packed = True


def _map(msg: Any, name: str, value_type: str) -> None:
    entry_name = "".join(p.capitalize() for p in name.split("_")) + "Entry"
    entry = msg.nested_type.add()
    entry.name = entry_name
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=value_type)
    _field(msg, name, 1, _F.TYPE_MESSAGE, repeated=True, type_name=f".tensorflow.{msg.name}.{entry_name}")


def _add_examples(fdp: Any, package: str) -> None:
    """``Example`` and ``SequenceExample`` over the ``Features`` and ``FeatureLists`` of ``package``."""
    example = fdp.message_type.add()
    example.name = "Example"
    _field(example, "features", 1, _F.TYPE_MESSAGE, type_name=f".{package}.Features")
    seq = fdp.message_type.add()
    seq.name = "SequenceExample"
    _field(seq, "context", 1, _F.TYPE_MESSAGE, type_name=f".{package}.Features")
    _field(seq, "feature_lists", 2, _F.TYPE_MESSAGE, type_name=f".{package}.FeatureLists")


def _build() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.name = "tfrfs/example.proto"
    fdp.package = "tensorflow"
    fdp.syntax = "proto3"

    for name, ftype in (("BytesList", _F.TYPE_BYTES), ("FloatList", _F.TYPE_FLOAT), ("Int64List", _F.TYPE_INT64)):
        m = fdp.message_type.add()
        m.name = name
        _field(m, "value", 1, ftype, repeated=True, packed=ftype != _F.TYPE_BYTES)

    feature = fdp.message_type.add()
    feature.name = "Feature"
    feature.oneof_decl.add().name = "kind"
    _field(feature, "bytes_list", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.BytesList", oneof=0)
    _field(feature, "float_list", 2, _F.TYPE_MESSAGE, type_name=".tensorflow.FloatList", oneof=0)
    _field(feature, "int64_list", 3, _F.TYPE_MESSAGE, type_name=".tensorflow.Int64List", oneof=0)

    features = fdp.message_type.add()
    features.name = "Features"
    _map(features, "feature", ".tensorflow.Feature")

    flist = fdp.message_type.add()
    flist.name = "FeatureList"
    _field(flist, "feature", 1, _F.TYPE_MESSAGE, repeated=True, type_name=".tensorflow.Feature")

    flists = fdp.message_type.add()
    flists.name = "FeatureLists"
    _map(flists, "feature_list", ".tensorflow.FeatureList")

    _add_examples(fdp, "tensorflow")

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow." + m.name))
        for m in fdp.message_type
    }


_CLASSES = _build()
BytesList = _CLASSES["BytesList"]
FloatList = _CLASSES["FloatList"]
Int64List = _CLASSES["Int64List"]
Feature = _CLASSES["Feature"]
Features = _CLASSES["Features"]
FeatureList = _CLASSES["FeatureList"]
FeatureLists = _CLASSES["FeatureLists"]
Example = _CLASSES["Example"]
SequenceExample = _CLASSES["SequenceExample"]

__all__ = ["BytesList", "FloatList", "Int64List", "Feature", "Features", "FeatureList",
           "FeatureLists", "Example", "SequenceExample"]


def _build_shallow() -> dict[str, Any]:
    """Messages that read an ``Example`` or ``SequenceExample`` one level deep: each feature (or
    feature list) kept as its encoded bytes. Parsing these is a few C calls per record, and the
    schema scan (``shardschema``) then looks into only the values it has not seen before."""
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.name = "tfrfs/shallow.proto"
    fdp.package = "tfrfs.shallow"
    fdp.syntax = "proto3"
    for name, field_name in (("Features", "feature"), ("FeatureLists", "feature_list")):
        m = fdp.message_type.add()
        m.name = name
        entry = m.nested_type.add()
        entry.name = "Entry"
        entry.options.map_entry = True
        _field(entry, "key", 1, _F.TYPE_STRING)
        _field(entry, "value", 2, _F.TYPE_BYTES)
        _field(m, field_name, 1, _F.TYPE_MESSAGE, repeated=True, type_name=f".tfrfs.shallow.{name}.Entry")
    _add_examples(fdp, "tfrfs.shallow")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName("tfrfs.shallow." + name))
            for name in ("Example", "SequenceExample")}


_SHALLOW = _build_shallow()
ShallowExample = _SHALLOW["Example"]
ShallowSequenceExample = _SHALLOW["SequenceExample"]
