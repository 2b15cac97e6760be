"""Plots of a local_cluster.sh run, from its workers' step files and logs.

    /usr/bin/python3 deploy/plot_run.py RUN_DIR

Writes RUN_DIR/loss.png (training loss against global step, one line per worker) and
RUN_DIR/accuracy.png (test accuracy against epoch, one line per worker that has evaluated),
printing each path it writes. The loss comes from RUN_DIR/worker*.steps.jsonl (ps_worker
--steps_file: every step's loss, drawn as the mean of the last 50 steps); runs without them
fall back to the progress lines of RUN_DIR/worker*.log, whose loss is the mean over the
epoch so far (one batch at an epoch's start: the dips there are that, not the model). The
accuracy comes from the logs. Lines it does not recognise are skipped. A restarted worker
appends to its files and a rollback sends its steps back: points are plotted in file order.
With no data at all it writes nothing, says so on stderr and exits 1.
Needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3).
"""
import collections
import json
import os
import re
import sys

# "worker 0 (ps): epoch 1/10 step 100/9370 loss 0.5123 4210 samples/s ETA 1m20s"; the loss
# is the mean over the epoch's steps so far.
LOSS = re.compile(r"worker \d+ \([\w-]+\): epoch \d+/\d+ step (\d+)/\d+ loss (\S+) ")
# "worker 0: epoch 1 test accuracy 0.8312"
ACCURACY = re.compile(r"worker \d+: epoch (\d+) test accuracy (\S+)\s*$")
LOG = re.compile(r"worker(\d+)\.log$")
STEPS = re.compile(r"worker(\d+)\.steps\.jsonl$")
WINDOW = 50  # steps in the loss plot's moving mean


def parse(path):
    """One log's ([(step, loss)], [(epoch, accuracy)]), in file order."""
    loss, accuracy = [], []
    with open(path, errors="replace") as f:
        for line in f:
            for pattern, points in ((LOSS, loss), (ACCURACY, accuracy)):
                m = pattern.search(line)  # after the log line's time, level and role
                if m:
                    try:  # a line cut short by a killed worker may hold no number
                        points.append((int(m[1]), float(m[2])))
                    except ValueError:
                        pass
                    break
    return loss, accuracy


def steps(path):
    """One steps file's [(step, mean loss of the last WINDOW steps)], in file order; the
    window starts afresh after a rollback. Lines that are not whole JSON are skipped (a
    killed worker's last line may be cut short)."""
    points, window = [], collections.deque(maxlen=WINDOW)
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "rollback" in rec:
                window.clear()
            elif isinstance(rec.get("loss"), (int, float)) and "step" in rec:
                window.append(rec["loss"])
                points.append((rec["step"], sum(window) / len(window)))
    return points


def logs(run_dir, pattern=LOG):
    """[(rank, path)] of the run's worker files matching `pattern`, by rank."""
    found = ((pattern.match(name), name) for name in os.listdir(run_dir))
    return sorted((int(m[1]), os.path.join(run_dir, name)) for m, name in found if m)


def plot(series, path, title, xlabel, ylabel, integer_x=False):
    """One line per (rank, points) in series, written to path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, (rank, points) in enumerate(series):
        xs, ys = zip(*points)
        # Hollow markers of differing shapes: workers with the same figures (ps mode's
        # shared parameters) stay visible on top of each other.
        # A line per step needs no markers; a few points do.
        marker = "os^vD"[i % 5] if len(points) <= 200 else None
        ax.plot(xs, ys, marker=marker, markersize=6 if integer_x else 4,
                fillstyle="none", label=f"worker {rank}")
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        xs = [x for _, points in series for x, _ in points]
        ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    run_dir = argv[0]
    if not os.path.isdir(run_dir):
        print(f"plot_run.py: {run_dir} is not a directory", file=sys.stderr)
        return 1
    losses, accuracies = [], []
    for rank, path in logs(run_dir):
        loss, accuracy = parse(path)
        if loss:
            losses.append((rank, loss))
        if accuracy:
            accuracies.append((rank, accuracy))
    per_step = [(rank, points) for rank, path in logs(run_dir, STEPS) if (points := steps(path))]
    loss_label = "loss (mean over the epoch so far)"
    if per_step:
        losses, loss_label = per_step, f"loss (mean of the last {WINDOW} steps)"
    if not losses and not accuracies:
        print(f"plot_run.py: no loss or accuracy lines in {run_dir}/worker*.log; "
              "nothing plotted", file=sys.stderr)
        return 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_run.py: matplotlib is missing (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 1
    name = os.path.basename(os.path.abspath(run_dir))
    if losses:
        path = os.path.join(run_dir, "loss.png")
        plot(losses, path, f"Training loss, run {name}", "global step (batches)", loss_label)
        print(path)
    if accuracies:
        path = os.path.join(run_dir, "accuracy.png")
        plot(accuracies, path, f"Test accuracy, run {name}", "epoch",
             "test accuracy (fraction correct)", integer_x=True)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
