"""TLS and tokens through the Python client and psctl, against a real ps_coordinator and two
ps_servers serving TLS with a cluster and an admin token; certificates and tokens from
deploy/make_certs.sh (openssl). Run as python/pscluster_test.py says (PSCTL too)."""
from __future__ import annotations

import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"  # as pscluster_test.py: Debian's grpcio and protobuf
if (os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) !=
        os.path.realpath(DEBIAN_PYTHON) and not os.environ.get("PSCLUSTER_TEST_REEXEC")):
    os.environ["PSCLUSTER_TEST_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])

import subprocess
import tempfile
import unittest
from unittest import mock

import grpc
import numpy as np

import pscluster
from pscluster.local import _REPO, LocalCluster, find_binary

TIMEOUT = 10.0


class SecureClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="pscluster_tls_")
        cls.dir = os.path.join(cls.tmp.name, "tls")
        script = os.path.join(_REPO, "deploy", "make_certs.sh")
        if not os.path.exists(script):
            script = "deploy/make_certs.sh"  # the runfiles' copy under Bazel
        subprocess.run([script, cls.dir, "localhost", "127.0.0.1"], check=True,
                       stdout=subprocess.DEVNULL)
        cls.flags = [f"--tls_ca={cls.path('ca.pem')}", f"--tls_cert={cls.path('node.pem')}",
                     f"--tls_key={cls.path('node.key')}",
                     f"--token_file={cls.path('cluster.token')}",
                     f"--admin_token_file={cls.path('admin.token')}"]
        cls.local = LocalCluster(num_shards=2, shard_args=cls.flags, coordinator_args=cls.flags)
        with open(cls.path("wrong.token"), "w") as f:
            f.write("f" * 64 + "\n")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.local.stop()
        cls.tmp.cleanup()

    @classmethod
    def path(cls, name: str) -> str:
        return os.path.join(cls.dir, name)

    def connect(self, token: str, **kwargs) -> pscluster.Cluster:
        return pscluster.connect(self.local.coordinator, timeout=TIMEOUT,
                                 tls_ca=self.path("ca.pem"), token_file=self.path(token),
                                 **kwargs)

    def table(self, name: str, table_id: int) -> int:
        with self.connect("admin.token") as admin:
            return admin.create_dense(name, 1000, table_id=table_id, optimizer="sgd",
                                      learning_rate=0.5,
                                      consistency="asp", initializer="constant", value=1.0)

    def test_the_cluster_token_trains_and_cannot_create_tables(self):
        t = self.table("trained", 1)
        with self.connect("cluster.token") as c:
            c.push_dense(t, np.full(1000, 2.0, np.float32))
            np.testing.assert_array_equal(c.pull_dense(t), np.full(1000, 0.0, np.float32))
            with self.assertRaises(pscluster.PsError) as e:
                c.create_dense("not_allowed", 10)
            self.assertEqual(e.exception.code, grpc.StatusCode.PERMISSION_DENIED)
            self.assertIn("needs the admin token", e.exception.message)

    def test_a_wrong_token_is_unauthenticated_and_changes_nothing(self):
        t = self.table("guarded", 2)
        with self.assertRaises(pscluster.PsError) as e:
            self.connect("wrong.token")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("wrong token", e.exception.message)
        # Straight to the shards, past the coordinator: refused before any handler runs.
        wrong = pscluster.Security.load(tls_ca=self.path("ca.pem"),
                                        token_file=self.path("wrong.token"))
        with pscluster.Cluster.from_shards(self.local.addresses, timeout=TIMEOUT,
                                           security=wrong) as intruder:
            with self.assertRaises(pscluster.PsError) as e:
                intruder.push_dense(t, np.full(1000, 5.0, np.float32), worker=9)
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        with self.connect("cluster.token") as c:
            np.testing.assert_array_equal(c.pull_dense(t), np.ones(1000, np.float32))

    def test_a_token_without_tls_and_plaintext_do_not_connect(self):
        # Without TLS a token goes over gRPC's local credentials, which a TLS cluster does
        # not speak; nor does plaintext.
        for kwargs in ({"token_file": self.path("cluster.token")}, {}):
            with self.assertRaises(pscluster.PsError) as e:
                pscluster.connect(self.local.coordinator, timeout=2.0, **kwargs)
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_the_environment_configures_connect(self):
        env = {"PSCLUSTER_TLS_CA": self.path("ca.pem"),
               "PSCLUSTER_TOKEN_FILE": self.path("cluster.token")}
        with mock.patch.dict(os.environ, env):
            with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as c:
                self.assertEqual(c.view().num_shards, 2)

    def test_psctl_takes_the_same_files(self):
        psctl = find_binary("psctl", "PSCTL", "tools/psctl/psctl")
        base = [psctl, f"--coordinator={self.local.coordinator}", f"--tls_ca={self.path('ca.pem')}"]
        ok = subprocess.run(base + [f"--token_file={self.path('cluster.token')}", "status"],
                            capture_output=True, text=True, timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("shard", ok.stdout)
        refused = subprocess.run(base + ["status"], capture_output=True, text=True, timeout=60)
        self.assertEqual(refused.returncode, 1)  # refused (3 is for unreachable)
        self.assertIn("UNAUTHENTICATED", refused.stderr)
        denied = subprocess.run(base + [f"--token_file={self.path('cluster.token')}",
                                        "switch-mode", "--mode=allreduce"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(denied.returncode, 1, denied.stderr)
        self.assertIn("PERMISSION_DENIED", denied.stderr)
        # The health protocol answers without a token (probes send none).
        health = subprocess.run(base + [f"--address={self.local.addresses[0]}", "health"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(health.returncode, 0, health.stderr)
        self.assertIn("SERVING", health.stdout)


class LoopbackTokenTest(unittest.TestCase):
    """Tokens without TLS, as deploy/local_cluster.sh runs by default: gRPC's local
    credentials on loopback, each call's token checked as over TLS."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="pscluster_tokens_")
        for name in ("cluster", "admin"):
            with open(os.path.join(cls.tmp.name, f"{name}.token"), "w") as f:
                f.write(os.urandom(32).hex() + "\n")
        flags = [f"--token_file={cls.tmp.name}/cluster.token",
                 f"--admin_token_file={cls.tmp.name}/admin.token"]
        cls.local = LocalCluster(num_shards=2, shard_args=flags, coordinator_args=flags)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.local.stop()
        cls.tmp.cleanup()

    def test_tokens_are_checked_on_loopback_without_tls(self):
        admin = pscluster.connect(self.local.coordinator, timeout=TIMEOUT,
                                  token_file=f"{self.tmp.name}/admin.token")
        with admin:
            t = admin.create_dense("loopback", 100, optimizer="sgd", learning_rate=1.0,
                                   consistency="asp")
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT,
                               token_file=f"{self.tmp.name}/cluster.token") as c:
            c.push_dense(t, np.ones(100, np.float32))
            np.testing.assert_array_equal(c.pull_dense(t), np.full(100, -1.0, np.float32))
        with self.assertRaises(pscluster.PsError) as e:  # no token: refused, not served
            pscluster.connect(self.local.coordinator, timeout=TIMEOUT)
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)


if __name__ == "__main__":
    unittest.main()
