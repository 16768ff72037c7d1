"""python -m ampc <command>

  doctor   what this environment can run: versions, ampc._cuda, GPUs, CPU SIMD
"""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ampc", description="ampc command line")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="report what this environment can run")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from ampc._doctor import doctor

        return doctor()
    return 2


if __name__ == "__main__":
    sys.exit(main())
