"""One call to one ps_server replica, for tests/netem/run.sh's partition case.

  replica_probe.py push ADDRESS     a client that still takes ADDRESS for its shard's head
                                    pushes to table 1: prints the gRPC status code name
  replica_probe.py fingerprint ADDRESS
                                    prints the replica's state fingerprint (Stats)
"""
import sys

import grpc

from pscluster._shards import ShardStub
from pscluster.proto import ps_pb2


def main() -> int:
    what, address = sys.argv[1], sys.argv[2]
    with grpc.insecure_channel(address) as channel:
        stub = ShardStub(channel)
        try:
            if what == "push":
                chunk = ps_pb2.DenseChunk(worker_id=0, step=1 << 20, table_id=1,
                                          data=b"\0\0\x80\x3f")
                stub.PushDenseBatch(ps_pb2.DenseBatch(chunks=[chunk]), timeout=10)
                print("OK")
            else:
                stats = stub.Stats(ps_pb2.StatsRequest(fingerprint=True), timeout=10)
                print(stats.fingerprint)
        except grpc.RpcError as e:
            print(e.code().name, e.details())
    return 0


if __name__ == "__main__":
    sys.exit(main())
