"""ampc <command> (or python -m ampc <command>); ampc --version

  doctor   what this environment can run: versions, ampc._cuda, GPUs, CPU SIMD
  demo     train one model in float32, AMP bfloat16 and AMP float16 + GradScaler, and compare

A command's modules are imported when that command runs (doctor never loads the demo and its models),
which is why the imports of ampc.cli's modules below sit inside main.
"""

import argparse
import os
import sys

import ampc


def _at_least(minimum):
    """An argparse type: an int of at least minimum (0 epochs or a batch of 0 trained nothing, or
    failed deep inside with a traceback)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _check_demo(parser, args):
    """What argparse's types cannot see, found before any training: the device, the plot's folder."""
    from ampc.cli.demo import device_index

    try:
        index = device_index(args.device)
    except (TypeError, ValueError) as error:
        parser.error(f"--device: {error}")
    if index >= 0:
        count = ampc.cuda.device_count() if ampc.cuda.is_available() else 0
        if index >= count:
            parser.error(f"--device {args.device}: this process sees {count} CUDA GPU(s)")
    if args.plot is not None:
        from ampc.cli.plot import MISSING, have_matplotlib

        if not have_matplotlib():
            parser.error(MISSING)
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"--plot {args.plot}: {folder} is not a folder this process can write to")


def _program_name():
    """How the user ran us: `ampc` (the console script) or `python -m ampc`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m ampc" if name in ("", "__main__.py", "-c") else name


def main(argv=None):
    parser = argparse.ArgumentParser(prog=_program_name(), description="ampc command line")
    parser.add_argument("--version", action="version", version=f"ampc {ampc.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="report what this environment can run")
    demo = commands.add_parser("demo", help="train a model three ways (fp32, AMP bf16, AMP fp16) and compare")
    demo.add_argument("--model", choices=("mlp", "resnet50", "gpt2"), default="mlp",
                      help="mlp: digits, trained to an accuracy; resnet50, gpt2: timed steps on random data")
    demo.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu, cuda or cuda:N")
    demo.add_argument("--epochs", type=_at_least(1), default=20, help="mlp: passes over the digits")
    demo.add_argument("--batch-size", type=_at_least(1), default=None, help="default: mlp 64, resnet50 256, gpt2 8")
    demo.add_argument("--steps", type=_at_least(1), default=9, help="resnet50, gpt2: timed steps (the median is reported)")
    demo.add_argument("--warmup", type=_at_least(0), default=3, help="resnet50, gpt2: untimed steps first")
    demo.add_argument("--image-size", type=_at_least(1), default=224, help="resnet50: image side")
    demo.add_argument("--seq-len", type=_at_least(1), default=1024, help="gpt2: tokens per sequence")
    demo.add_argument("--channels-last", action="store_true", help="resnet50: NHWC images and weights (both libraries)")
    demo.add_argument("--compare-torch", action="store_true", help="add torch's AMP rows, measured in this run")
    demo.add_argument("--distributed", action="store_true",
                      help="under mpirun -n N (MPI, the CPU) or torchrun --nproc_per_node=N (NCCL on the GPUs): "
                           "the model data-parallel, the ranks' agreement and speed-up (resnet50, gpt2: with "
                           "--compare-torch, torch's DistributedDataParallel in the same run)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--nan-at", type=_at_least(0), metavar="STEP",
                      help="mlp: a NaN in this step's batch, in every run: the GradScaler skips that step, "
                           "the unscaled runs' weights turn NaN")
    demo.add_argument("--plot", metavar="FILE", help="mlp: save a PNG of loss and loss scale against the step "
                                                   "(matplotlib: the demo extra)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        _check_demo(demo, args)
    if args.command == "doctor":
        from ampc.cli.doctor import doctor

        return doctor()
    if args.command == "demo" and args.distributed:
        from ampc.cli.demo_distributed import run

        return run(args)
    if args.command == "demo":
        from ampc.cli.demo import run

        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
