"""Baseline for bench/allreduce_bench: PyTorch's torch.distributed gloo all_reduce of the
same sizes, N processes on loopback, same timing method (median after 3 warm-ups, a
barrier before each call). Run with Debian's /usr/bin/python3 (python3-torch).

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/allreduce_torch.py --ranks 2 --iters 20 --json /tmp/torch.json
"""
import argparse, json, os, statistics, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, ranks, iters, port, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    rows = []
    size = 1024
    if rank == 0:
        print(f"{'bytes':>12} {'time us':>12} {'algbw GB/s':>12} {'busbw GB/s':>12}")
    while size <= 64 << 20:
        x = torch.empty(size // 4, dtype=torch.float32)
        times = []
        for i in range(iters + 3):
            x.fill_(rank + 1)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if i >= 3:
                times.append(time.perf_counter() - t0)
            assert x[len(x) // 2].item() == ranks * (ranks + 1) / 2
        t = statistics.median(times)
        algbw = size / t / 1e9
        busbw = algbw * 2 * (ranks - 1) / ranks
        if rank == 0:
            print(f"{size:12d} {t * 1e6:12.1f} {algbw:12.3f} {busbw:12.3f}")
            rows.append({"bytes": size, "algbw": algbw, "busbw": busbw})
        size *= 4
    if rank == 0 and out:
        json.dump(rows, open(out, "w"), indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--port", type=int, default=29611)
    p.add_argument("--json", default="")
    a = p.parse_args()
    mp.spawn(run, args=(a.ranks, a.iters, a.port, a.json), nprocs=a.ranks)
