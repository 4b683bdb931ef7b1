"""The bytes on disk: TFRecord framing and CRCs, GZIP/ZLIB streams, the protobuf wire format and
our own ``Example`` definitions, the walk past damage (SPEC 6), and feature values <-> files
(codec, names, JSON text; SPEC 3).

May import: ``tfrfs.errors`` only. Knows nothing of storage, indexes, mounts or jobs.
"""
