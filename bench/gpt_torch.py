"""The PyTorch twin of worker/model/gpt: the same decoder-only transformer (GPT-2's layout:
pre-LayerNorm blocks, causal multi-head attention, a 4x GELU MLP with the tanh approximation,
a final LayerNorm and a head tied to the token embedding), with the same parameter names
and order as the C++ spec. worker/model/gpt_torch_test.py checks the C++ model's loss and
every gradient against it on identical weights and inputs.

Run with Debian's /usr/bin/python3 (python3-torch).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


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
        """GPT-2's initialisation, as the C++ spec's (different random numbers)."""
        residual = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias") or ".ln" in name or name.startswith("lnf"):
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
