"""python -m ampc <command>: the command line lives in ampc.cli (ampc.cli.main reads the arguments)."""

import sys

from ampc.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
