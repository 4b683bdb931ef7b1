"""The schema's reference (SPEC 5): what ``schema.json`` says of records, computed the slow,
obvious way (protobuf parses each record whole, the renderer says how each value is shown). The
scan's tallies, Python and compiled, are held to it (tests/unit/test_schema_index.py,
tests/unit/test_bulk.py)."""

from __future__ import annotations

from tfrfs.format import codec, proto

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4"
       b"\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82")


def reference(records: list[bytes], kind: str, decode_raw: bool = True) -> dict:
    """schema.json's ``features``/``feature_lists`` computed the slow, obvious way."""
    acc: dict[str, dict] = {"features": {}, "feature_lists": {}}

    def count(table: str, key: str, kind: str, n: int, shown: str, newline: bool) -> None:
        e = acc[table].setdefault(key, {"kinds": {}, "records": 0, "n": [], "shown": {}, "newline": 0})
        e["records"] += 1
        e["kinds"][kind] = e["kinds"].get(kind, 0) + 1
        e["n"].append(n)
        e["shown"][shown] = e["shown"].get(shown, 0) + 1
        e["newline"] += newline

    def newline(v: codec.Value) -> bool:
        return v.kind == "bytes_list" and any(x.endswith(b"\n") for x in v.values)

    for data in records:
        try:
            msg = (proto.SequenceExample if kind == "sequence" else proto.Example).FromString(data)
        except Exception:  # noqa: BLE001
            continue
        feats = msg.context.feature if kind == "sequence" else msg.features.feature
        values = {k: codec.value_from_proto(f) for k, f in feats.items()}
        shapes = codec.raw_shapes(values) if decode_raw else {}
        for key, value in values.items():
            shown = "raw pixels .png" if key in shapes else codec.render(value).suffix
            count("features", key, value.kind, len(value.values), shown, newline(value))
        if kind == "sequence":
            for key, flist in msg.feature_lists.feature_list.items():
                steps = [codec.value_from_proto(f) for f in flist.feature]
                kinds = {s.kind for s in steps}
                k = kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "empty")
                count("feature_lists", key, k, len(steps), codec.render_feature_list(steps).suffix,
                      any(newline(s) for s in steps))
    out = {}
    for table, keys in acc.items():
        out[table] = {}
        for key, e in keys.items():
            kinds = sorted(e["kinds"], key=lambda k: (-e["kinds"][k], k))
            out[table][key] = {"kind": kinds[0] if len(kinds) == 1 else kinds, "records": e["records"],
                               "min_values": min(e["n"]), "max_values": max(e["n"]),
                               "shown_as": sorted(e["shown"], key=lambda s: (-e["shown"][s], s)),
                               "ending_in_newline": e["newline"]}
    return out
