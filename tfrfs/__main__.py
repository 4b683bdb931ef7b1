import sys

from tfrfs.cli import main

sys.exit(main())
