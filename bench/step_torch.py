"""PyTorch's side of bench/step_breakdown.cc: one training step of the same MLP
(784-256-128-64-10, batch 64, Adam lr 1e-3) on one thread, no communication.

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/step_torch.py [--steps 1000]
"""
import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
import time  # noqa: E402

import torch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1)
    layers = [784, 256, 128, 64, 10]
    mods = []
    for i in range(len(layers) - 1):
        mods.append(torch.nn.Linear(layers[i], layers[i + 1]))
        if i + 2 < len(layers):
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods)
    x, y = torch.randn(a.batch, 784), torch.randint(0, 10, (a.batch,))
    opt = torch.optim.Adam(model.parameters(), 1e-3)

    def timed(what, fn):
        for _ in range(a.steps // 10 + 1):
            fn()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            fn()
        ms = (time.perf_counter() - t0) / a.steps * 1e3
        print(f"{what:<34} {ms:8.3f} ms/step")
        return ms

    def fb():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()

    fwd_bwd = timed("forward + backward", fb)
    total = timed("forward + backward + adam", lambda: (fb(), opt.step()))
    print(f"{'adam (difference)':<34} {total - fwd_bwd:8.3f} ms/step")
    print(f"{'sum':<34} {total:8.3f} ms/step ({a.batch / total * 1e3:.0f} samples/s per worker "
          "before communication)")


if __name__ == "__main__":
    main()
