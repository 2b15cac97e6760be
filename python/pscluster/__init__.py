"""pscluster: a Python client for the pscluster parameter server.

    import numpy as np
    import pscluster
    cluster = pscluster.connect("127.0.0.1:7000")          # the coordinator
    w = cluster.create_dense("w", 1000, optimizer="adam", learning_rate=1e-3,
                             consistency="bsp")
    values = cluster.pull_dense(w, step=0)
    cluster.push_dense(w, np.ones(1000, np.float32), step=0)
    emb = cluster.create_sparse("emb", dim=8, initializer="normal", scale=0.01)
    rows = cluster.pull_sparse(emb, [3, 17, 3])             # shape (3, 8)

With TLS and tokens: pscluster.connect(address, tls_ca="ca.pem", token_file="cluster.token")
(pscluster.security says more).

Every error is a PsError (.code: grpc.StatusCode, .message, .shard). The PyTorch
integration is pscluster.torch (imported separately: it needs python3-torch).
"""
# From a checkout the stubs are generated apart from the sources (bazel-bin/python/
# pscluster/proto): the package spans every `pscluster` directory on sys.path.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from pscluster.client import Cluster, PsError, connect, shard_range
from pscluster.security import Security

__all__ = ["Cluster", "PsError", "Security", "connect", "shard_range"]
