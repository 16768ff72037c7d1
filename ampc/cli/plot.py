"""The demo's plot (--plot FILE): loss, and loss scale on an axis of its own, against the step, one
line per run, drawn with matplotlib (the `demo` extra: pip install 'ampc[demo]')."""

import math

MISSING = "--plot needs matplotlib: python -m pip install 'ampc[demo]' (or matplotlib itself)"

# each run keeps its own color and dash, so that runs whose losses coincide stay visible: one dash
# drawn over another leaves the first showing through the gaps
STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 2)))


def have_matplotlib():
    """Whether --plot can draw (the CLI asks before any training)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def first_nonfinite(values):
    """The first step whose value is inf or NaN (where a run's loss broke), or None."""
    return next((i for i, v in enumerate(values) if not math.isfinite(v)), None)


def save_training_plot(path, results):
    """Loss (top) and loss scale (bottom, log2 axis) against the step, one line per run; a run whose
    loss turned inf or NaN gets an x at its last finite value before, and its legend says whether it
    stayed so ('NaN from step k on') or trained on (a GradScaler's skipped step); a run without a
    GradScaler has no scale line."""
    import matplotlib

    matplotlib.use("Agg")  # a file, no window: works without a display
    import matplotlib.pyplot as plt

    figure, (loss_axes, scale_axes) = plt.subplots(2, 1, figsize=(9, 6.4), sharex=True,
                                                   gridspec_kw={"height_ratios": [3, 2]})
    for k, run in enumerate(results):
        color, style = f"C{k % 10}", STYLES[k % len(STYLES)]
        losses = run["losses"]
        broke = first_nonfinite(losses)
        label = run["name"]
        if broke is not None:
            for_good = not any(math.isfinite(v) for v in losses[broke:])
            label += f" (NaN from step {broke} on)" if for_good else f" (NaN at step {broke}, trained on)"
        steps = range(len(losses))
        shown = [v if math.isfinite(v) else math.nan for v in losses]  # a gap, not a line to infinity
        loss_axes.plot(steps, shown, color=color, linestyle=style, linewidth=1.2, label=label)
        if broke is not None and broke > 0:
            loss_axes.plot(broke - 1, losses[broke - 1], marker="x", markersize=10, color=color)
        elif broke == 0:
            loss_axes.axvline(0, color=color, linestyle=style)
        if run.get("scale") is not None:  # a scaled run: its loss scale, step by step
            scale_axes.plot(steps, run["scales"], color=color, linestyle=style, linewidth=1.2, label=run["name"])
    loss_axes.set_ylabel("loss")
    loss_axes.grid(True, alpha=0.3)
    loss_axes.legend(loc="upper right", fontsize="small")
    loss_axes.set_title("training loss and GradScaler's loss scale, each run")
    scale_axes.set_yscale("log", base=2)
    scale_axes.set_ylabel("loss scale")
    scale_axes.set_xlabel("step")
    scale_axes.grid(True, alpha=0.3)
    if scale_axes.get_lines():
        scale_axes.legend(loc="lower right", fontsize="small")
    else:
        scale_axes.text(0.5, 0.5, "no run with a GradScaler", ha="center", va="center",
                        transform=scale_axes.transAxes)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
