"""Write the small TensorFlow-written shards the fuzz layer damages (run as a subprocess)::

    python tests/fuzz/tf_shards.py OUTDIR

Every shard is written by ``tf.io.TFRecordWriter`` through the interop fixtures' helpers
(tests/interop/tf_fixtures.py): Examples, SequenceExamples (with an empty record), raw records,
and a GZIP and a ZLIB shard. Messages are serialized deterministically (map entries in key order),
so a run writes the same bytes as the last. Nothing from tfrfs is used.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))

import tf_fixtures as tff  # noqa: E402

SHARDS = {
    "tf_examples.tfrecord": (lambda: tff.small_examples(40, "fz"), ""),
    "tf_seq.tfrecords": (tff.seq_records, ""),
    "tf_raw.tfrecord": (tff.raw_records, ""),
    "tf_gzip.tfrecord.gz": (lambda: tff.small_examples(60, "gz"), "GZIP"),
    "tf_zlib-00000-of-00001": (lambda: tff.small_examples(30, "zl"), "ZLIB"),
}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: tf_shards.py OUTDIR", file=sys.stderr)
        return 2
    out = os.path.abspath(argv[1])
    for name, (records, compression) in SHARDS.items():
        # map entries in key order, so the same bytes every run (and the same mutants for a seed)
        data = [r if isinstance(r, (bytes, bytearray)) else r.SerializeToString(deterministic=True)
                for r in records()]
        tff.write_shard(os.path.join(out, name), data, compression)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
