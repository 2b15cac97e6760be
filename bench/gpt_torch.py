"""The PyTorch twin of worker/model/gpt: the same decoder-only transformer (GPT-2's layout:
pre-LayerNorm blocks, causal multi-head attention, a 4x GELU MLP with the tanh approximation,
a final LayerNorm and a head tied to the token embedding), with the same parameter names
and order as the C++ spec. worker/model/gpt_torch_test.py checks the C++ model's loss and
every gradient against it on identical weights and inputs.

Run with Debian's /usr/bin/python3 (python3-torch).
"""
import math
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before torch loads OpenBLAS (../shared/BENCHMARKING.md)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, width, heads, eps):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, eps=eps)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width, eps=eps)
        self.fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        dh = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, dh).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers=4, heads=4, width=256, context=128, vocab=256, eps=1e-5):
        super().__init__()
        self.context, self.vocab = context, vocab
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, eps) for _ in range(layers))
        self.lnf = nn.LayerNorm(width, eps=eps)
        self.init_like_gpt2(layers)

    def init_like_gpt2(self, layers):
        """GPT-2's initialisation, as the C++ spec's (other random numbers): weights N(0,
        0.02^2), the residual projections 0.02 / sqrt(2 layers), biases 0, LayerNorms 1, 0."""
        residual = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if ".ln" in name or name.startswith("lnf"):
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
                continue
            std = residual if name.endswith(("proj.weight", "mlp_proj.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lnf(x) @ self.wte.weight.T
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))
        return logits, loss

    def in_spec_order(self):
        """(tensor, transposed) per C++ parameter, in the C++ spec's order: a Linear's
        weight is stored out x in here and in x out there."""
        out = [(self.wte.weight, False), (self.wpe.weight, False)]
        for blk in self.blocks:
            for layer in (blk.ln1, blk.qkv, blk.proj, blk.ln2, blk.fc, blk.mlp_proj):
                out.append((layer.weight, isinstance(layer, nn.Linear)))
                out.append((layer.bias, False))
        out += [(self.lnf.weight, False), (self.lnf.bias, False)]
        return out

    def load_spec_tensors(self, tensors):
        """Copies flat float32 arrays in the C++ spec's order into the parameters."""
        with torch.no_grad():
            for (p, transposed), flat in zip(self.in_spec_order(), tensors, strict=True):
                shape = p.shape[::-1] if transposed else p.shape
                value = torch.as_tensor(flat).reshape(shape)
                p.copy_(value.T if transposed else value)

    def spec_grads(self):
        """The gradients as flat float32 arrays in the C++ spec's order."""
        return [(p.grad.T if transposed else p.grad).contiguous().reshape(-1).numpy()
                for p, transposed in self.in_spec_order()]


# --- Training: the PyTorch baseline of `ps_worker --model=gpt` (same data, split, model,
# batch, Adam and learning-rate decay), single-process or DDP on gloo. ---

def load_fortunes(directory="/usr/share/games/fortunes", held_out_every=10):
    """worker/data/text.cc's LoadFortunes: the files whose names have no '.', sorted, cut
    into fortunes at lines that are a lone "%"; every held_out_every-th fortune (counted
    over all files) is held out; each fortune is followed by "%\\n"."""
    train, held, count = [], [], 0
    for name in sorted(n for n in os.listdir(directory) if "." not in n):
        path = os.path.join(directory, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        content = open(path, "rb").read()
        if not content:
            continue
        if content.endswith(b"\n"):
            content = content[:-1]
        fortune = []
        for line in content.split(b"\n") + [None]:  # None: the end of the file
            if line is None or line == b"%":
                if fortune:
                    count += 1
                    (held if count % held_out_every == 0 else train).append(
                        b"".join(fortune) + b"%\n")
                    fortune = []
            else:
                fortune.append(line + b"\n")
    return b"".join(train), b"".join(held)


def windows(text, context):
    """worker/data/text.cc's MakeLanguageModelData: inputs and next-byte labels."""
    import numpy as np
    data = np.frombuffer(text, dtype=np.uint8)
    n = (len(data) - 1) // context
    x = data[:n * context].reshape(n, context).astype(np.int64)
    y = data[1:n * context + 1].reshape(n, context).astype(np.int64)
    return x, y


def bigram_bits_per_byte(train, held_out):
    """Held-out bits per byte of a byte bigram model (add-one smoothing) fitted on train:
    the baseline a language model must beat."""
    import numpy as np
    a = np.frombuffer(train, dtype=np.uint8).astype(np.int64)
    counts = np.ones((256, 256))
    np.add.at(counts, (a[:-1], a[1:]), 1)
    probs = counts / counts.sum(axis=1, keepdims=True)
    b = np.frombuffer(held_out, dtype=np.uint8).astype(np.int64)
    return float(-np.log2(probs[b[:-1], b[1:]]).mean())


def evaluate(model, x, y, batch=16):
    """Mean held-out loss (nats per byte) and next-byte accuracy."""
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            xb, yb = torch.as_tensor(x[i:i + batch]), torch.as_tensor(y[i:i + batch])
            logits, loss = model(xb, yb)
            total += loss.item() * yb.numel()
            correct += (logits.argmax(-1) == yb).sum().item()
            n += yb.numel()
    model.train()
    return total / n, correct / n


def train(args):
    import json
    import time

    import numpy as np
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = args.rank, args.world
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world)
    train_text, held_text = load_fortunes(args.text_dir)
    x, y = windows(train_text, args.context)
    hx, hy = windows(held_text, args.context)
    torch.manual_seed(args.seed)
    model = Gpt(args.layers, args.heads, args.width, args.context)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    per_epoch = len(x) // (world * args.batch_size)
    total = per_epoch * args.epochs
    if args.max_steps:
        total = min(total, args.max_steps)
    # ps_worker's schedule at update t (1-based): lr * min(1, t / warmup) * decay^((t-1)/total).
    warmup = max(args.lr_warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: min(1.0, (t + 1) / warmup) * args.lr_decay ** (t / total))
    start, last = time.perf_counter(), time.perf_counter()
    step, losses = 0, []
    while step < total:
        order = np.random.default_rng(args.seed * 1000 + step // per_epoch).permutation(len(x))
        p = step % per_epoch
        idx = order[(p * world + rank) * args.batch_size:(p * world + rank + 1) * args.batch_size]
        _, loss = model(torch.as_tensor(x[idx]), torch.as_tensor(y[idx]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        step += 1
        now = time.perf_counter()
        if rank == 0 and (now - last >= 5 or step == total):
            rate = step * args.batch_size * world * args.context / (now - start)
            print(f"torch gpt: step {step}/{total} loss {np.mean(losses[-50:]):.4f} "
                  f"{rate:,.0f} tokens/s ETA {(total - step) * (now - start) / step:.0f} s",
                  flush=True)
            last = now
    seconds = time.perf_counter() - start
    result = {"framework": "torch", "world": world, "steps": total, "train_seconds": seconds,
              "tokens_per_sec": total * args.batch_size * world * args.context / seconds}
    if rank == 0:
        core = model.module if world > 1 else model
        loss, acc = evaluate(core, hx, hy)
        result.update(test_loss=loss, bits_per_byte=loss / math.log(2), test_accuracy=acc,
                      bigram_bits_per_byte=bigram_bits_per_byte(train_text, held_text))
        print(json.dumps(result), flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    import argparse
    import socket
    import subprocess
    import sys

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=16, help="sequences per process per step")
    p.add_argument("--world", type=int, default=1, help="processes (DDP on gloo when > 1)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr_decay", type=float, default=0.1)
    p.add_argument("--lr_warmup_steps", type=int, default=100,
                   help="linear warmup, as ps_worker --model=gpt (its default too)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--text_dir", default="/usr/share/games/fortunes")
    p.add_argument("--bigram", action="store_true", help="print the bigram baseline and exit")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bigram:
        train_text, held_text = load_fortunes(args.text_dir)
        print(f"bigram: {bigram_bits_per_byte(train_text, held_text):.4f} bits per byte "
              f"({len(train_text)} training bytes, {len(held_text)} held out)")
        return
    if args.rank >= 0 or args.world == 1:
        args.rank = max(args.rank, 0)
        train(args)
        return
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:] +
                              [f"--rank={r}", f"--port={port}"]) for r in range(args.world)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
