"""The demo's progress: a tqdm bar per run (rate and time left) where tqdm is installed (the `demo`
extra), else one line per run when it ends."""

import sys
import time

try:
    from tqdm import tqdm
except ImportError:  # the demo runs without its extras; it only loses the live bar
    tqdm = None


class Progress:
    """Progress of one run of `total` steps on stderr: show(done, loss) after each step."""

    def __init__(self, name, total, stream=None):
        # sys.stderr as it is now, not as it was at import (pytest may have closed that capture)
        self.stream = sys.stderr if stream is None else stream
        self.name, self.total, self.began = name, total, time.perf_counter()
        self.bar = None if tqdm is None else tqdm(total=total, desc=f"{name:14s}", unit="step", file=self.stream,
                                                  leave=True, dynamic_ncols=True)

    def show(self, done, loss):
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
            self.bar.update(done - self.bar.n)
            if done == self.total:
                self.bar.close()
        elif done == self.total:
            seconds = time.perf_counter() - self.began
            self.stream.write(f"{self.name:14s} {done} steps in {seconds:.1f} s ({done / max(seconds, 1e-9):.0f} "
                              f"steps/s), loss {loss:.4f}\n")
            self.stream.flush()
