"""A small built-in sample dataset, drawn with Pillow, for the demo and the tests.

``write_sample(dest)`` writes, under ``dest``::

    train/train-0000{0,1}-of-00002.tfrecord   Object Detection API Examples (12 each)
    val/val-00000-of-00001.tfrecord           the same layout (6 records)
    label_map.pbtxt, dataset_info.json        plain files beside the shards
    mnist_raw.tfrecord                        28x28 gray digits as raw pixel arrays (20)
    raw_rgb.tfrecord                          32x24 RGB raw pixel arrays under image/encoded (8)
    clips.tfrecord                            SequenceExamples: per-frame boxes, tags, JPEGs (4)
    tabular.tfrecord.gz                       GZIP shard of tabular Examples (50)

Every random choice comes from a ``random.Random`` seeded per record, so two runs write
byte-identical files (given the same Pillow and zlib builds). Nothing is downloaded and no
font is needed: the digits are drawn as strokes, so the output does not depend on FreeType.

Run ``python -m tfrfs.sample DEST`` to write it to a new or empty folder.

Not part of the mounted file system: no module of tfrfs itself imports this package, so Pillow's
drawing code stays out of the daemon. ``draw`` holds the pictures, ``dataset`` the shards.

May import: ``tfrfs.format`` and ``tfrfs.errors`` only.
"""

from tfrfs.sample.dataset import main, write_sample
from tfrfs.sample.draw import CLASS_ID, CLASSES, Box, draw_digit, draw_scene

__all__ = ["CLASSES", "CLASS_ID", "Box", "draw_digit", "draw_scene", "main", "write_sample"]
