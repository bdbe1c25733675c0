import sys

from bundlegen.cli import main

sys.exit(main())
