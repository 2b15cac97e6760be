"""Fashion-MNIST helpers shared by the PyTorch baselines in bench/ (cnn_ddp_torch.py,
torch_rpc_ps.py): the data, two small models, the per-rank data order and test accuracy.

Importing this module has no side effects: numpy and torch are imported inside the
functions that need them, so a launcher can set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS
first.

    load(split)             -> images float32 [N, 1, 28, 28], labels int64 [N]
    make_cnn()              -> 2 conv + 2 linear layers (about 420k parameters)
    make_mlp(layers)        -> Linear + ReLU stack, default 784-256-128-64-10
    batches(n, B, rank, world, epoch, seed) -> int64 [steps, B]: rank's batches this epoch
    accuracy(model, images, labels)         -> fraction of the test set classified right

The data: the IDX .gz files of Debian's package dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist; override with PSCLUSTER_FASHION_MNIST), read with
gzip + numpy like bench/ddp_torch.py and the workers' data::LoadFashionMnist: pixels
p/255, normalised with mean 0.2860 / std 0.3530, in float32.
"""
import gzip
import os

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
ENV_DIR = "PSCLUSTER_FASHION_MNIST"
MEAN, STD = 0.2860, 0.3530  # worker/data/dataset.h kFashionMnistMean / kFashionMnistStd
_PREFIX = {"train": "train", "test": "t10k"}  # the files' names for the two splits
_IMAGES_MAGIC, _LABELS_MAGIC = 0x803, 0x801


def data_dir():
    return os.environ.get(ENV_DIR) or DEFAULT_DIR


def _read_idx(path, magic):
    """One IDX file (gzip'd): uint8 [count, rows*cols] for images, uint8 [count] for labels."""
    import numpy as np
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: install Debian's package dataset-fashion-mnist "
            f"(apt-get install dataset-fashion-mnist) or point {ENV_DIR} at a folder "
            f"with the Fashion-MNIST IDX .gz files")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        raise ValueError(f"{path}: bad magic 0x{got:08x}, want 0x{magic:08x}")
    count = int.from_bytes(raw[4:8], "big")
    if magic == _IMAGES_MAGIC:
        rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
        data = np.frombuffer(raw, dtype=np.uint8, offset=16)
        if data.size != count * rows * cols:
            raise ValueError(f"{path}: truncated images")
        return data.reshape(count, rows * cols)
    data = np.frombuffer(raw, dtype=np.uint8, offset=8)
    if data.size != count or (data.size and data.max() >= 10):
        raise ValueError(f"{path}: truncated labels or a label outside [0, 10)")
    return data


def load(split):
    """(images float32 [N, 1, 28, 28] normalised, labels int64 [N]) of split "train" or "test"."""
    import numpy as np
    if split not in _PREFIX:
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    folder, prefix = data_dir(), _PREFIX[split]
    images = _read_idx(f"{folder}/{prefix}-images-idx3-ubyte.gz", _IMAGES_MAGIC)
    labels = _read_idx(f"{folder}/{prefix}-labels-idx1-ubyte.gz", _LABELS_MAGIC)
    if len(images) != len(labels):
        raise ValueError(f"{split}: {len(images)} images but {len(labels)} labels")
    if images.shape[1] != 28 * 28:
        raise ValueError(f"{split}: images of {images.shape[1]} pixels, want 784")
    # A 256-entry lookup table: the same float32 arithmetic for every pixel value.
    lut = (np.arange(256, dtype=np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STD)
    return lut[images].reshape(-1, 1, 28, 28), labels.astype(np.int64)


def make_cnn():
    """Conv(1->32, 3x3) ReLU MaxPool2 Conv(32->64, 3x3) ReLU MaxPool2 Linear(3136->128) ReLU
    Linear(128->10). PyTorch's default init: seed it with torch.manual_seed first."""
    from torch import nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


def make_mlp(layers=(784, 256, 128, 64, 10)):
    """Flatten, then Linear layers of the given sizes with ReLU between them (none after
    the last). PyTorch's default init: seed it with torch.manual_seed first."""
    from torch import nn
    if len(layers) < 2:
        raise ValueError("make_mlp needs at least two layer sizes")
    mods = [nn.Flatten()]
    for i in range(len(layers) - 1):
        mods.append(nn.Linear(layers[i], layers[i + 1]))
        if i + 2 < len(layers):
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def batches(n, batch_size, rank, world, epoch, seed):
    """Rank `rank`'s batches for one epoch, int64 [steps, batch_size] of example indices.

    The epoch's order is one permutation of range(n) from
    numpy.random.default_rng(seed * 1000 + epoch), shared by every rank; rank r's batch at
    position p is entries [(p*world + r)*B, (p*world + r + 1)*B): disjoint shards, the same
    layout as the workers' data::BatchIterator. steps = n // (world * B); the tail is dropped.
    """
    import numpy as np
    if not 0 <= rank < world or batch_size < 1:
        raise ValueError(f"need 0 <= rank < world and batch_size >= 1 (rank {rank}, "
                         f"world {world}, batch_size {batch_size})")
    steps = n // (world * batch_size)
    perm = np.random.default_rng(seed * 1000 + epoch).permutation(n)
    return perm[: steps * world * batch_size].reshape(steps, world, batch_size)[:, rank, :].copy()


def accuracy(model, images, labels, batch=1000):
    """Fraction of (images, labels) that model classifies right; numpy arrays or tensors.
    Runs under torch.no_grad in eval mode and restores the model's training mode."""
    import torch
    x = torch.as_tensor(images)
    y = torch.as_tensor(labels)
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    model.train(was_training)
    return correct / max(len(x), 1)
