"""python -m ampc <command>

  doctor   what this environment can run: versions, ampc._cuda, GPUs, CPU SIMD
  demo     train one model in float32, AMP bfloat16 and AMP float16 + GradScaler, and compare
"""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ampc", description="ampc command line")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="report what this environment can run")
    demo = commands.add_parser("demo", help="train a model three ways (fp32, AMP bf16, AMP fp16) and compare")
    demo.add_argument("--epochs", type=int, default=20)
    demo.add_argument("--batch-size", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--plot", metavar="FILE", help="save a PNG of loss and loss scale against the step")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from ampc._doctor import doctor

        return doctor()
    if args.command == "demo":
        from ampc._demo import run

        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
