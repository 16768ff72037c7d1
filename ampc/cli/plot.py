"""A PNG of the demo's runs (loss, and loss scale, against the step) with no plotting library: an
RGB canvas, lines, a 3x5 pixel font for the labels, and PNG's zlib framing."""

import math
import struct
import zlib

# one per run, as matplotlib's first six: ampc's three runs, then torch's (--compare-torch)
COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75))

# 3x5 glyphs, one row of three bits per digit (top row first)
FONT = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71717", "4": "55711", "5": "74717", "6": "74757",
    "7": "71111", "8": "75757", "9": "75717", ".": "00002", "-": "00700", " ": "00000", "(": "24442",
    ")": "42224", "a": "03557", "b": "44757", "c": "03443", "e": "07743", "f": "34644", "g": "35716",
    "h": "44755", "l": "44443", "o": "02552", "p": "07574", "r": "05644", "s": "03636", "t": "27222",
    "A": "25755", "M": "57555", "P": "75744",
}


class Canvas:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x, y, color):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(color)

    def line(self, x0, y0, x1, y1, color):
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            self.dot(round(x0 + (x1 - x0) * s / steps), round(y0 + (y1 - y0) * s / steps), color)

    def text(self, x, y, string, color=(0, 0, 0), size=2):
        for ch in string:
            rows = FONT.get(ch, FONT[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if int(bits) >> (2 - c) & 1:
                        for dy in range(size):
                            for dx in range(size):
                                self.dot(x + c * size + dx, y + r * size + dy, color)
            x += 4 * size

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width])
                       for y in range(self.height))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _label(v):
    return f"{v:.3g}".replace("e+0", "e").replace("e+", "e")


def _panel(canvas, top, height, title, series, log2=False):
    """One chart: series (name, values) against the step, from y = top, height pixels tall."""
    left, right = 70, canvas.width - 20
    plot_top, plot_bottom = top + 30, top + height - 30
    values = [v for _, vs in series for v in vs if math.isfinite(v) and (v > 0 or not log2)]
    if not values:
        return
    tf = (lambda v: math.log2(v)) if log2 else (lambda v: v)
    low, high = min(tf(v) for v in values), max(tf(v) for v in values)
    if high - low < 1e-12:
        low, high = low - 1, high + 1
    steps = max(len(vs) for _, vs in series)
    black, grey = (0, 0, 0), (200, 200, 200)
    canvas.text(left, top + 8, title)
    for k in range(5):  # grid and y ticks
        y = plot_bottom - (plot_bottom - plot_top) * k // 4
        canvas.line(left, y, right, y, grey)
        tick = low + (high - low) * k / 4
        canvas.text(4, y - 5, _label(2 ** tick if log2 else tick), size=2)
    canvas.line(left, plot_top, left, plot_bottom, black)
    canvas.line(left, plot_bottom, right, plot_bottom, black)
    for k in range(5):  # x ticks: steps
        x = left + (right - left) * k // 4
        canvas.text(x - 8, plot_bottom + 6, str(round((steps - 1) * k / 4)), size=2)
    canvas.text(right - 30, plot_bottom + 18, "step")
    for (name, vs), color in zip(series, COLORS):
        points = [(left + (right - left) * i / max(steps - 1, 1),
                   plot_bottom - (plot_bottom - plot_top) * (tf(v) - low) / (high - low))
                  for i, v in enumerate(vs) if math.isfinite(v) and (v > 0 or not log2)]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            canvas.line(round(x0), round(y0), round(x1), round(y1), color)


def save_training_plot(path, results, width=900, height=640):
    """Loss (top) and loss scale, log2 (bottom), against the step, one color per run, legend at top right."""
    canvas = Canvas(width, height)
    half = height // 2
    _panel(canvas, 0, half, "loss", [(r["name"], r["losses"]) for r in results])
    _panel(canvas, half, half, "loss scale (log2)", [(r["name"], r["scales"]) for r in results], log2=True)
    for i, (r, color) in enumerate(zip(results, COLORS)):
        y = 8 + 14 * i
        for dy in range(8):
            canvas.line(width - 150, y + dy, width - 138, y + dy, color)
        canvas.text(width - 132, y, r["name"])
    with open(path, "wb") as f:
        f.write(canvas.png())
