import sys

from tfrfs.cli.parser import main

sys.exit(main())
