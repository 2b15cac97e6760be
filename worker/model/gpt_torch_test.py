"""worker/model/gpt against PyTorch (bench/gpt_torch.py): the same weights and inputs, the
loss and every gradient. The reference runs in float64, so the tolerance measures the C++
model's float32 error: loss within 1e-5 relative, each gradient within 1e-4 of its
largest magnitude (observed: see the printed errors)."""
import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"  # with python3-torch; see python/pscluster_test.py
if (os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) !=
        os.path.realpath(DEBIAN_PYTHON) and not os.environ.get("PSCLUSTER_TEST_REEXEC")):
    os.environ["PSCLUSTER_TEST_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])

import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import unittest  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpt_torch  # noqa: E402


class GptAgainstTorchTest(unittest.TestCase):
    def test_loss_and_every_gradient(self):
        dump = os.environ.get("GPT_DUMP", "worker/model/gpt_dump")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "gpt.bin")
            subprocess.run([dump, path] + os.environ.get("GPT_DUMP_SHAPE", "").split(), check=True)
            with open(path, "rb") as f:
                meta = json.loads(f.readline())
                floats = np.frombuffer(f.read(), dtype=np.float32)
        n = meta["batch"] * meta["context"]
        tokens, labels = floats[:n], floats[n:2 * n]
        at, params, grads = 2 * n, [], []
        for out in (params, grads):
            for size in meta["sizes"]:
                out.append(floats[at:at + size].astype(np.float64))
                at += size
        self.assertEqual(at, floats.size)

        torch.manual_seed(0)
        model = gpt_torch.Gpt(meta["layers"], meta["heads"], meta["width"], meta["context"],
                              meta["vocab"]).double()
        model.load_spec_tensors(params)
        shape = (meta["batch"], meta["context"])
        idx = torch.as_tensor(tokens.astype(np.int64)).reshape(shape)
        target = torch.as_tensor(labels.astype(np.int64)).reshape(shape)
        _, loss = model(idx, target)
        loss.backward()
        print(f"loss: ours {meta['loss']:.7f}, torch (float64) {loss.item():.7f}")
        self.assertAlmostEqual(meta["loss"], loss.item(), delta=1e-5 * abs(loss.item()))
        names = ["wte", "wpe"] + [f"h{l}.{t}" for l in range(meta["layers"]) for t in (
            "ln1.gamma", "ln1.beta", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
            "attn.proj.bias", "ln2.gamma", "ln2.beta", "mlp.fc.weight", "mlp.fc.bias",
            "mlp.proj.weight", "mlp.proj.bias")] + ["lnf.gamma", "lnf.beta"]
        worst = 0.0
        for name, ours, theirs in zip(names, grads, model.spec_grads(), strict=True):
            scale = np.abs(theirs).max()
            self.assertGreater(scale, 0, f"{name}: the reference gradient is all zero")
            err = np.abs(ours - theirs).max() / scale
            worst = max(worst, err)
            self.assertLess(err, 1e-4, f"{name}: max error {err:.2e} of its largest gradient")
        print(f"every gradient: worst max error {worst:.2e} of the tensor's largest value")


if __name__ == "__main__":
    unittest.main()
