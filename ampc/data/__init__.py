"""Data sets ampc ships for its demo and tests (README.md beside this file says where from)."""

import gzip
import os

import numpy as np

__all__ = ["load_digits"]


def load_digits():
    """(images, labels): the 1797 handwritten digits, images float32 of shape (1797, 64) scaled to
    [0, 1], labels int64 in 0..9."""
    path = os.path.join(os.path.dirname(__file__), "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return (table[:, :-1] / 16.0).astype(np.float32), table[:, -1].astype(np.int64)
