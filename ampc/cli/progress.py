"""The demo's progress bar: one line on stderr per run, ampc's runs and torch's alike."""

import sys


class Progress:
    """A one-line progress bar on stderr, redrawn as it fills; off a terminal, one line at the end."""

    def __init__(self, name, total, stream=None, width=30):
        # sys.stderr as it is now, not as it was at import (pytest had closed that capture on the GPU machine)
        stream = sys.stderr if stream is None else stream
        self.name, self.total, self.stream, self.width = name, total, stream, width
        self.live = getattr(stream, "isatty", lambda: False)()
        self.drawn = -1

    def show(self, done, loss):
        filled = self.width * done // max(self.total, 1)
        if done != self.total and (not self.live or filled == self.drawn):
            return
        self.drawn = filled
        self.stream.write(f"\r{self.name:14s} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                          f"loss {loss:.4f}" + ("\n" if done == self.total else ""))
        self.stream.flush()
