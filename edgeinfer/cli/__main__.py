import sys

from edgeinfer.cli import main

sys.exit(main())
