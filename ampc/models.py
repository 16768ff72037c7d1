"""Models built from ampc.nn: torchvision's ResNet-50 (the same parameter names and shapes, so a
torchvision state dict loads) and a GPT-2-style transformer (nanoGPT's layout: GPT-2 small is
``gpt()``, 124 M parameters with the output layer tied to the token embedding)."""

import math

import numpy as np

from ampc import nn
from ampc._interop import array_namespace, is_torch
from ampc.nn import functional as F
from ampc.nn.modules import _generator

__all__ = ["Bottleneck", "GPT", "ResNet", "gpt", "resnet50"]


def _normal_(param, std):
    values = _generator().standard_normal(param.data.shape, dtype=np.float32)
    values *= np.float32(std)
    param.data[...] = values


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: 1x1, 3x3 (with the block's stride), 1x1, and the
    shortcut (a strided 1x1 convolution and batch norm where the shape changes)."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet v1.5 with bottleneck blocks: layers gives each stage's block count ((3, 4, 6, 3) is
    ResNet-50)."""
    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._layer(64, layers[0])
        self.layer2 = self._layer(128, layers[1], stride=2)
        self.layer3 = self._layer(256, layers[2], stride=2)
        self.layer4 = self._layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for module in self.modules():  # torchvision's: kaiming_normal_(mode="fan_out", nonlinearity="relu")
            if isinstance(module, nn.Conv2d):
                fan_out = module.out_channels * module.kernel_size[0] * module.kernel_size[1]
                _normal_(module.weight, math.sqrt(2.0 / fan_out))

    def _layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(F.flatten(self.avgpool(x), 1))


def resnet50(num_classes=1000):
    """torchvision.models.resnet50(): 25,557,032 parameters for 1000 classes."""
    return ResNet((3, 4, 6, 3), num_classes)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = F.split(self.c_attn(x), self.n_embd, dim=2)
        q, k, v = (F.transpose(F.reshape(z, (b, t, self.n_head, c // self.n_head)), 1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = F.reshape(F.transpose(y, 1, 2), (b, t, c))
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT-2: token and position embeddings, pre-norm blocks, a final layer norm, and the
    output layer tied to the token embedding. ``model(idx)`` gives the logits (B, T, vocab);
    ``model(idx, targets)`` gives (logits, loss)."""

    def __init__(self, vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's
        for name, p in self.named_parameters():  # GPT-2's: N(0, 0.02), residual projections scaled down
            if name.endswith("c_proj.weight"):
                _normal_(p, 0.02 / math.sqrt(2 * n_layer))
            elif name.endswith("bias"):
                p.data[...] = 0
            elif p.data.ndim == 2:
                _normal_(p, 0.02)

    def forward(self, idx, targets=None):
        b, t = idx.shape
        if t > self.block_size:
            raise ValueError(f"Cannot forward sequence of length {t}, block size is only {self.block_size}")
        positions = _positions(idx, t)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(F.reshape(logits, (b * t, -1)), F.reshape(targets, (b * t,)))
        return logits, loss


def _positions(idx, t):
    """0 .. t-1 as an index array in idx's library and on its device."""
    lib = array_namespace(idx)
    if lib is np:
        return np.arange(t)
    if is_torch(idx):
        return lib.arange(t, device=idx.device)
    if lib.__name__ == "ampc._array_namespace":
        return lib.arange(t, like=idx)
    return lib.arange(t)


def gpt(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0.0):
    """A GPT-2-style model; the defaults are GPT-2 small (124,439,808 parameters)."""
    return GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
