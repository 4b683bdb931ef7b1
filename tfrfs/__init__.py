"""tfrfs: mount TFRecord datasets as folders of records and feature files."""

__version__ = "0.1.0"
