"""Observability against the real tools: a running local cluster (coordinator, 2 shards, 2
ps_workers, every one serving --metrics_port) scraped by a real Prometheus (Debian's
`prometheus`), its expositions checked by `promtool check metrics`, the coordinator's status
page rendered by headless Chromium (a screenshot kept in the test's outputs), and the gRPC
health protocol of a shard watched through a restore of a large snapshot.

    bazel test //tests:observability_test
    (screenshot: bazel-testlogs/tests/observability_test/test.outputs/outputs.zip)

A tool that is not installed skips its test with the reason printed (deploy/install_deps.sh
installs them).
"""
from __future__ import annotations

import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"  # see python/pscluster_test.py: Debian's packages
if (os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) !=
        os.path.realpath(DEBIAN_PYTHON) and not os.environ.get("PSCLUSTER_TEST_REEXEC")):
    os.environ["PSCLUSTER_TEST_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])

import json
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request
from typing import Callable, List, Optional, TypeVar

import grpc
import numpy as np

import pscluster
from pscluster.local import LocalCluster, Process, find_binary
from pscluster.proto import ps_pb2

HEARTBEAT_TIMEOUT_MS = 2000
OUTPUTS = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or tempfile.mkdtemp(prefix="obs_out_")
T = TypeVar("T")


def wait_until(what: str, check: Callable[[], Optional[T]], timeout: float) -> T:
    """check()'s first truthy answer, polled until `timeout` seconds; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except (OSError, ValueError, KeyError) as e:  # not up yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last})")


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def metrics_url(p: Process) -> str:
    for line in p.seen:
        m = re.search(r"metrics on (http://\S+/metrics)", line)
        if m:
            return m.group(1)
    raise AssertionError(f"{p.args[0]} printed no metrics address: {p.seen}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(text: str, name: str, **labels: str) -> Optional[float]:
    """The value of the sample `name` whose labels include `labels`, from exposition text."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


class RunningClusterTest(unittest.TestCase):
    """One cluster for the class: training runs throughout; the last test kills a worker."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="obs_test_")
        cls.local = LocalCluster(
            num_shards=2, num_workers=2, data_dir=cls.tmp.name, log_dir=cls.tmp.name,
            coordinator_args=["--metrics_port=-1", "--http_port=-1",
                              f"--heartbeat_timeout_ms={HEARTBEAT_TIMEOUT_MS}"],
            shard_args=["--metrics_port=-1"])
        cls.workers: List[Process] = []
        try:
            coordinator = cls.local.processes[0]
            cls.page = next(re.search(r"status page on (http://\S+/)", l).group(1)
                            for l in coordinator.seen if "status page on" in l)
            worker = find_binary("ps_worker", "PS_WORKER", "worker/ps_worker")
            for rank in range(2):
                p = cls.local._start(f"worker{rank}", [
                    worker, f"--coordinator={cls.local.coordinator}", f"--rank={rank}",
                    "--world=2", "--synthetic=20000", "--layers=20,32,4", "--epochs=1000",
                    "--batch_size=32", "--progress_every=200ms", "--metrics_port=-1"])
                p.wait_for(r"metrics on http://")
                cls.workers.append(p)
            cls.targets = [metrics_url(p) for p in
                           [coordinator, *cls.local.shards, *cls.workers]]
            for p in cls.workers:
                p.wait_for(r"epoch \d+/\d+ step", timeout=120)  # training, reporting
        except BaseException:
            cls.local.stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.local.stop()
        cls.tmp.cleanup()

    def test_1_prometheus_scrapes_every_process(self) -> None:
        prometheus = shutil.which("prometheus")
        if not prometheus:
            self.skipTest("prometheus is not installed (apt-get install prometheus)")
        port = free_port()
        config = os.path.join(self.tmp.name, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
                    "scrape_configs:\n- job_name: pscluster\n  static_configs:\n"
                    "  - targets: [" + ", ".join(
                        urllib.parse.urlparse(t).netloc for t in self.targets) + "]\n")
        log = open(os.path.join(OUTPUTS, "prometheus.log"), "w")
        proc = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
             f"--storage.tsdb.path={self.tmp.name}/prometheus"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            api = f"http://127.0.0.1:{port}/api/v1/query?query="

            def query(q: str) -> list:
                answer = json.loads(http_get(api + urllib.parse.quote(q)))
                self.assertEqual(answer["status"], "success", answer)
                return answer["data"]["result"]

            def all_up() -> bool:
                up = query("up")
                return len(up) == len(self.targets) and all(r["value"][1] == "1" for r in up)
            wait_until("every target up in Prometheus", all_up, 60)

            def samples() -> float:
                r = query("sum(pscluster_worker_samples_total)")
                return float(r[0]["value"][1]) if r else 0.0
            first = wait_until("pscluster_worker_samples_total scraped", samples, 30)
            wait_until("pscluster_worker_samples_total to increase",
                       lambda: samples() > first, 30)
            rates = wait_until("rate() over two scrapes per worker", lambda: (
                r if len(r := query("rate(pscluster_worker_samples_total[5s])")) == 2 else None),
                30)
            for r in rates:
                self.assertGreater(float(r["value"][1]), 0, r)
            up = query("up")
            self.assertEqual(sorted(r["metric"]["instance"] for r in up),
                             sorted(urllib.parse.urlparse(t).netloc for t in self.targets))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()

    def test_2_every_exposition_passes_promtool(self) -> None:
        promtool = shutil.which("promtool")
        if not promtool:
            self.skipTest("promtool is not installed (apt-get install prometheus)")
        for url in self.targets:
            text = http_get(url)
            check = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                                   capture_output=True, timeout=60)
            self.assertEqual(check.returncode, 0, f"{url}:\n{check.stdout}{check.stderr}")
        worker = http_get(self.targets[-1])
        self.assertGreater(sample(worker, "pscluster_worker_learning_rate"), 0)
        for name in ["pscluster_worker_steps_total", "pscluster_worker_loss",
                     "pscluster_worker_step_seconds_bucket", "pscluster_worker_samples_per_second"]:
            self.assertIsNotNone(sample(worker, name), name)
        self.assertEqual(sample(worker, "pscluster_worker_mode", mode="ps"), 1.0)
        self.assertGreater(sample(worker, "pscluster_worker_step_phase_seconds_total",
                                  phase="communication"), 0)
        shard = http_get(self.targets[1])
        self.assertGreater(sample(shard, "pscluster_ps_pushed_bytes_total"), 0)
        self.assertGreater(sample(shard, "pscluster_ps_table_memory_bytes"), 0)
        coordinator = http_get(self.targets[0])
        self.assertEqual(sample(coordinator, "pscluster_coordinator_members", role="worker",
                                state="alive"), 2.0)
        self.assertIsNotNone(sample(coordinator, "pscluster_coordinator_heartbeat_age_seconds",
                                    role="shard", id="1"))
        self.assertEqual(sample(coordinator, "pscluster_coordinator_rollbacks_total"), 0.0)
        # The standard process metrics, in every process.
        for text in (worker, shard, coordinator):
            self.assertGreater(sample(text, "process_cpu_seconds_total"), 0)
            self.assertGreater(sample(text, "process_open_fds"), 0)
            self.assertGreater(sample(text, "process_start_time_seconds"), 1.7e9)

    def test_3_invalid_requests_show_in_the_rpc_counter_with_their_code(self) -> None:
        shard = self.targets[1]
        name = "pscluster_rpc_server_handled_total"
        labels = dict(grpc_service="pscluster.ps.ShardData", grpc_method="PullDense")

        def count(code: str) -> float:
            return sample(http_get(shard), name, grpc_code=code, **labels) or 0.0
        before_missing, before_garbage = count("NOT_FOUND"), count("INVALID_ARGUMENT")
        with grpc.insecure_channel(self.local.addresses[0]) as channel:
            stub = channel.unary_unary("/pscluster.ps.ShardData/PullDense",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            missing = ps_pb2.PullDenseRequest(worker_id=0, step=0, table_id=424242, length=1)
            for request, code in [(missing.SerializeToString(), grpc.StatusCode.NOT_FOUND),
                                  (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT)]:
                with self.assertRaises(grpc.RpcError) as e:
                    stub(request, timeout=10)
                self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertEqual(count("NOT_FOUND"), before_missing + 1)
        self.assertEqual(count("INVALID_ARGUMENT"), before_garbage + 1)

    def chromium(self, *args: str) -> subprocess.CompletedProcess:
        browser = shutil.which("chromium")
        if not browser:
            self.skipTest("chromium is not installed (apt-get install chromium)")
        profile = tempfile.mkdtemp(prefix="chromium_", dir=self.tmp.name)
        return subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", *args, self.page],
            capture_output=True, text=True, timeout=120)

    def test_4_status_page_in_chromium(self) -> None:
        # Both workers have two progress points on the curves, then the browser draws it.
        wait_until("two loss points per worker on the page", lambda: all(
            int(m) >= 2 for m in re.findall(r'data-worker="\d" data-points="(\d+)"',
                                            http_get(self.page))[:2]) and len(re.findall(
                r'id="loss-chart".*?data-worker="1"', http_get(self.page), re.S)) > 0, 60)
        shot = os.path.join(OUTPUTS, "status_page.png")
        r = self.chromium(f"--screenshot={shot}", "--window-size=1280,1400")
        self.assertTrue(os.path.exists(shot) and os.path.getsize(shot) > 10000,
                        f"no screenshot: {r.stderr[-2000:]}")
        dom = self.chromium("--dump-dom").stdout
        with open(os.path.join(OUTPUTS, "status_page.html"), "w") as f:
            f.write(dom)
        for role, ids in [("shard", (0, 1)), ("worker", (0, 1))]:
            for i in ids:
                self.assertIn(f'data-role="{role}" data-id="{i}"', dom)
        self.assertRegex(dom, r'<b id="mode">ps</b>')
        points = re.search(r'id="loss-chart".*?<polyline[^>]*points="([^"]+)"', dom, re.S)
        self.assertIsNotNone(points, "no loss curve in the DOM")
        self.assertGreaterEqual(len(points.group(1).split()), 2)
        # Each worker's step split, as the workers measured it, in the step-time bars: a
        # compute time above zero (its width in pixels is relative to the slowest worker's
        # whole step, which a loaded machine can stretch past 300 times the compute).
        for i in (0, 1):
            bar = re.search(rf'<rect class="compute" data-worker="{i}"[^>]*>'
                            rf'<title>compute ([0-9.,]+) ms</title>', dom)
            self.assertIsNotNone(bar, f"no compute bar for worker {i}")
            self.assertIsNone(re.fullmatch(r"[0.,]+", bar.group(1)), bar.group(0))
        self.assertNotIn('class="dead"', dom)

    def test_5_a_member_that_dies_shows_dead_within_the_heartbeat_timeout(self) -> None:
        self.workers[1].kill()
        killed = time.monotonic()
        row = re.compile(r'data-role="worker" data-id="1">.*?class="dead">DEAD', re.S)
        # Declared dead once silent for the timeout (checked every timeout/4), plus the
        # worker's last heartbeat interval.
        wait_until("worker 1 shown DEAD on the status page",
                   lambda: row.search(http_get(self.page)), HEARTBEAT_TIMEOUT_MS / 1000 * 2)
        took = time.monotonic() - killed
        print(f"worker 1 shown dead {took:.2f} s after SIGKILL (timeout "
              f"{HEARTBEAT_TIMEOUT_MS / 1000} s)")
        dom = self.chromium("--dump-dom").stdout
        self.assertRegex(dom, row)


class HealthDuringRestoreTest(unittest.TestCase):
    """grpc.health.v1.Health/Watch on a shard: SERVING, NOT_SERVING while it restores a
    large snapshot (256 MB of values and Adam state), SERVING after."""

    def test_not_serving_while_restoring(self) -> None:
        with tempfile.TemporaryDirectory(prefix="obs_health_") as tmp, \
                LocalCluster(num_shards=1, data_dir=tmp) as local:
            cluster = pscluster.connect(local.coordinator, timeout=120)
            cluster.create_dense("big", 1 << 24, optimizer="adam", learning_rate=0.01)
            cluster.push_dense("big", np.full(1 << 24, 0.5, np.float32), step=0)
            taken = cluster.checkpoint(timeout=300)
            statuses: List[int] = []
            got = threading.Condition()
            with grpc.insecure_channel(local.addresses[0]) as channel:
                watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                             request_serializer=lambda b: b,
                                             response_deserializer=lambda b: b)
                stream = watch(b"", timeout=300)  # HealthCheckRequest{service: ""}

                def read() -> None:
                    try:
                        for answer in stream:  # HealthCheckResponse{status: varint}
                            with got:
                                statuses.append(answer[1] if len(answer) == 2 else 0)
                                got.notify_all()
                    except grpc.RpcError:
                        pass
                reader = threading.Thread(target=read, daemon=True)
                reader.start()
                with got:
                    self.assertTrue(got.wait_for(lambda: statuses, timeout=30))
                self.assertEqual(statuses, [1], "SERVING before the restore")
                cluster.restore(taken["step"])
                with got:
                    self.assertTrue(got.wait_for(lambda: len(statuses) >= 3, timeout=60),
                                    statuses)
                stream.cancel()
                reader.join(timeout=30)
            self.assertEqual(statuses[:3], [1, 2, 1], "SERVING, NOT_SERVING, SERVING")


if __name__ == "__main__":
    unittest.main(verbosity=2)
