"""deploy/plot_run.py: loss.png and accuracy.png of a run, from its workers' logs.

    /usr/bin/python3 -m unittest deploy.plot_run_test     # from the checkout
    bazel test //deploy:plot_run_test
"""
import os
import sys

# Bazel 4's py_test runs the first `python3` on PATH (its py3wrapper.sh), which need not be
# Debian's, and plot_run.py needs Debian's python3-matplotlib: start again under
# /usr/bin/python3 (the stub's PYTHONPATH carries over), as python/pscluster_test.py does.
DEBIAN_PYTHON = "/usr/bin/python3"
if (os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) !=
        os.path.realpath(DEBIAN_PYTHON) and not os.environ.get("PSCLUSTER_TEST_REEXEC")):
    os.environ["PSCLUSTER_TEST_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])

import contextlib  # noqa: E402
import io  # noqa: E402
import tempfile  # noqa: E402
import unittest  # noqa: E402
from unittest import mock  # noqa: E402

import matplotlib  # noqa: E402
import numpy  # noqa: E402

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from deploy import plot_run  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"

# Lines as the worker logs them (common/logging.h: time, level, role and id first), with
# the others a log holds (stderr too).
WORKER0 = "".join(f"2026-12-07T03:12:{i:02d}.071Z I ps_worker/0 {line}\n" for i, line in enumerate("""\
worker 0: coordinator at 127.0.0.1:40001, world 2
worker 0 (ps): epoch 1/2 step 100/200 loss 0.9000 4210 samples/s ETA 10s
worker 0 (ps): epoch 1/2 step 100/200 loss 0.5
worker 0 (ps): epoch 1/2 step 100/200 loss 0.5worker 0: progress report: UNAVAILABLE
worker 0 (ps): epoch 1/2 step 100/200 loss 0.7000 4300 samples/s ETA 8s
worker 0: epoch 1 test accuracy 0.8000
worker 0 (ps): epoch 2/2 step 150/200 loss 0.6000 4400 samples/s ETA 5s
worker 0: progress report: UNAVAILABLE: shard 1 is down
worker 0 (allreduce): epoch 2/2 step 120/200 loss 0.6500 4000 samples/s ETA 6s
worker 0 (allreduce): epoch 2/2 step 200/200 loss 0.5000 4100 samples/s ETA 0s
worker 0: epoch 2 test accuracy 0.8500
""".splitlines()))
# Killed during epoch 1 and replaced: the replacement appends to the same log. Without
# the log's prefix, as workers before common/logging.h wrote it.
WORKER1 = """\
worker 1 (ps): epoch 1/2 step 60/200 loss 1.1000 3000 samples/s ETA 20s
worker 1 (ps): epoch 1/2 step 40/200 loss 1.2000 3100 samples/s ETA 21s
worker 1 (ps): epoch 1/2 step 90/200 loss 0.8000 3200 samples/s ETA 15s
"""


def write(directory, name, text):
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)


def empty_figure_size(directory):
    """Bytes of a PNG of plot_run's figure size with axes, title and labels but no data."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    ax.set(title="Training loss, run x", xlabel="global step (batches)", ylabel="loss")
    path = os.path.join(directory, "empty.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    size = os.path.getsize(path)
    os.remove(path)
    return size


def pixels_of(path, color):
    """How many pixels of the PNG at path are within 0.1 of matplotlib color 'color'."""
    image = matplotlib.image.imread(path)[..., :3]
    return int((abs(image - numpy.array(matplotlib.colors.to_rgb(color))) < 0.1).all(-1).sum())


class PlotRunTest(unittest.TestCase):

    def run_main(self, directory):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = plot_run.main([directory])
        return status, out.getvalue(), err.getvalue()

    def test_parse_keeps_file_order_and_skips_what_it_does_not_recognise(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "worker0.log", WORKER0)
            write(d, "worker1.log", WORKER1)
            self.assertEqual(plot_run.parse(os.path.join(d, "worker0.log")), (
                [(100, 0.9), (100, 0.7), (150, 0.6), (120, 0.65), (200, 0.5)],
                [(1, 0.8), (2, 0.85)]))
            self.assertEqual(plot_run.parse(os.path.join(d, "worker1.log")),
                             ([(60, 1.1), (40, 1.2), (90, 0.8)], []))

    def test_steps_give_a_moving_mean_that_starts_afresh_after_a_rollback(self):
        with tempfile.TemporaryDirectory() as d:
            lines = [f'{{"step": {i}, "epoch": 1, "loss": {float(i)}, "mode": "ps"}}'
                     for i in range(60)]
            lines += ['{"rollback": {"failed": 60, "resumed": 40}}',
                      '{"step": 40, "epoch": 1, "loss": 7.0, "mode": "ps"}',
                      '{"step": 41, "epoch": 1, "loss": 9.0', ""]  # cut short by a kill
            write(d, "worker0.steps.jsonl", "\n".join(lines))
            points = plot_run.steps(os.path.join(d, "worker0.steps.jsonl"))
        self.assertEqual(points[0], (0, 0.0))
        self.assertEqual(points[59], (59, sum(range(10, 60)) / 50))  # the last 50 steps
        self.assertEqual(points[60:], [(40, 7.0)])

    def test_the_loss_plot_comes_from_the_steps_files_when_there_are_some(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "worker0.log", WORKER0)
            write(d, "worker0.steps.jsonl", "".join(
                f'{{"step": {i}, "loss": {2.0 / (i + 1)}}}\n' for i in range(300)))
            with mock.patch.object(plot_run, "plot", wraps=plot_run.plot) as plot, \
                    contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(plot_run.main([d]), 0)
            series, ylabel = plot.call_args_list[0].args[0], plot.call_args_list[0].args[4]
            self.assertEqual([rank for rank, _ in series], [0])
            self.assertEqual(len(series[0][1]), 300)  # the log has 6 loss points
            self.assertEqual(ylabel, "loss (mean of the last 50 steps)")
            self.assertTrue(os.path.exists(os.path.join(d, "loss.png")))

    def test_logs_are_found_by_rank(self):
        with tempfile.TemporaryDirectory() as d:
            for name in ("worker10.log", "worker2.log", "worker0.json", "shard0.log"):
                write(d, name, "")
            self.assertEqual(plot_run.logs(d), [(2, os.path.join(d, "worker2.log")),
                                                (10, os.path.join(d, "worker10.log"))])

    def test_both_plots_are_written_with_every_workers_data(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "worker0.log", WORKER0)
            write(d, "worker1.log", WORKER1)
            status, out, _ = self.run_main(d)
            self.assertEqual(status, 0)
            loss, accuracy = os.path.join(d, "loss.png"), os.path.join(d, "accuracy.png")
            self.assertEqual(out.split(), [loss, accuracy])
            empty = empty_figure_size(d)
            for path in (loss, accuracy):
                with open(path, "rb") as f:
                    self.assertEqual(f.read(8), PNG, path)
                self.assertGreater(os.path.getsize(path), empty, path)
            self.assertEqual(matplotlib.image.imread(loss).shape[:2], (500, 800))
            # A line per worker in the loss plot (default colors C0, C1); worker 1 has no
            # accuracy, so the accuracy plot has worker 0's line alone.
            self.assertGreater(pixels_of(loss, "C0"), 100)
            self.assertGreater(pixels_of(loss, "C1"), 100)
            self.assertGreater(pixels_of(accuracy, "C0"), 100)
            self.assertEqual(pixels_of(accuracy, "C1"), 0)

    def test_without_accuracy_only_the_loss_plot_is_written(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "worker1.log", WORKER1)
            status, out, _ = self.run_main(d)
            self.assertEqual(status, 0)
            self.assertEqual(out.split(), [os.path.join(d, "loss.png")])
            self.assertFalse(os.path.exists(os.path.join(d, "accuracy.png")))

    def test_no_data_exits_1_with_a_message_and_writes_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, "worker0.log", "worker 0: coordinator at 127.0.0.1:40001, world 1\n")
            status, out, err = self.run_main(d)
            self.assertEqual(status, 1)
            self.assertEqual(out, "")
            self.assertIn("no loss or accuracy lines", err)
            self.assertEqual(sorted(os.listdir(d)), ["worker0.log"])

    def test_no_logs_at_all_exits_1(self):
        with tempfile.TemporaryDirectory() as d:
            status, _, err = self.run_main(d)
            self.assertEqual(status, 1)
            self.assertIn("nothing plotted", err)
            self.assertEqual(os.listdir(d), [])


if __name__ == "__main__":
    unittest.main()
