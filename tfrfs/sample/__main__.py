"""``python -m tfrfs.sample DEST``: write the sample dataset to a new or empty folder."""

from tfrfs.sample.dataset import main

raise SystemExit(main())
