import sys

from hack.benchlib.cli import main

sys.exit(main())
