"""The three parameter sets of spec/anchors.md as lists of shapes, written out so that the
benchmarks need neither torchvision nor a model: ResNet-50 (torchvision's layout, 161
tensors, 25.6 M elements), GPT-2 124M (148 tensors) and a LLaMA-style 1.2B model (147)."""


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(width, inplanes, 1, 1), (width,), (width,), (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if b == 0:
                shapes += [(4 * width, inplanes, 1, 1), (4 * width,), (4 * width,)]
            inplanes = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def gpt2_shapes(d=768, layers=12, vocab=50257, ctx=1024):
    per_layer = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [(vocab, d), (ctx, d)] + per_layer * layers + [(d,), (d,)]


def llama_shapes(d=2048, ff=8192, layers=16, vocab=32000):
    per_layer = [(d, d)] * 4 + [(ff, d), (ff, d), (d, ff), (d,), (d,)]
    return [(vocab, d)] + per_layer * layers + [(d,), (vocab, d)]


SETS = {"ResNet-50": resnet50_shapes, "GPT-2 124M": gpt2_shapes, "LLaMA-style 1.2B": llama_shapes}
