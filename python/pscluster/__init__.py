"""pscluster: a Python client for the pscluster parameter server.

    import pscluster
    cluster = pscluster.connect("127.0.0.1:7000")
    table = cluster.create_dense("w", 1000, optimizer="sgd", learning_rate=0.1)
    w = cluster.pull_dense(table)
    cluster.push_dense(table, grad)

Dense tables only in this first increment (see client.py). Every error is a PsError.
"""
from pscluster.client import Cluster, PsError, connect, shard_range

__all__ = ["Cluster", "PsError", "connect", "shard_range"]
