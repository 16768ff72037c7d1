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
    demo.add_argument("--model", choices=("mlp", "resnet50", "gpt2"), default="mlp",
                      help="mlp: digits, trained to an accuracy; resnet50, gpt2: timed steps on random data")
    demo.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu, cuda or cuda:N")
    demo.add_argument("--epochs", type=int, default=20, help="mlp: passes over the digits")
    demo.add_argument("--batch-size", type=int, default=None, help="default: mlp 64, resnet50 256, gpt2 8")
    demo.add_argument("--steps", type=int, default=9, help="resnet50, gpt2: timed steps (the median is reported)")
    demo.add_argument("--warmup", type=int, default=3, help="resnet50, gpt2: untimed steps first")
    demo.add_argument("--image-size", type=int, default=224, help="resnet50: image side")
    demo.add_argument("--seq-len", type=int, default=1024, help="gpt2: tokens per sequence")
    demo.add_argument("--channels-last", action="store_true", help="resnet50: NHWC images and weights (both libraries)")
    demo.add_argument("--compare-torch", action="store_true", help="add torch's AMP rows, measured in this run")
    demo.add_argument("--distributed", action="store_true",
                      help="under mpirun -n N (MPI, the CPU) or torchrun --nproc_per_node=N (NCCL on the GPUs): "
                           "the MLP data-parallel, the ranks' agreement and speed-up")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--nan-at", type=int, metavar="STEP",
                      help="mlp: a NaN in this step's batch, in every run: the GradScaler skips that step, "
                           "the unscaled runs' weights turn NaN")
    demo.add_argument("--plot", metavar="FILE", help="mlp: save a PNG of loss and loss scale against the step")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from ampc._doctor import doctor

        return doctor()
    if args.command == "demo" and args.distributed:
        from ampc._demo_distributed import run

        return run(args)
    if args.command == "demo":
        from ampc._demo import run

        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
