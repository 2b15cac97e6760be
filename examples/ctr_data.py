"""A synthetic click-through-rate data set with a KNOWN generating model (examples/ctr.py).

Every example has F categorical fields (default 8). Field f has V_f ids (DEFAULT_SIZES:
4M, 3M, 2M, 1M, 100k, 10k, 1000, 100: 10,111,100 ids in all) and its id is drawn so:

    rank ~ Zipf(a_f) truncated to {1, ..., V_f}          (a_f: DEFAULT_ZIPF, 1.25 .. 1.3)
    id   = (m_f * (rank - 1) + c_f) mod V_f                (a fixed seeded permutation:
                                                            m_f coprime with V_f, so the
                                                            popular ids are scattered)
    key  = offset_f + id                                   (offset_f = V_0 + ... + V_{f-1})

so the model sees GLOBAL keys in [0, K), K = sum V_f, one shared embedding table.

The label is Bernoulli(sigmoid(logit)) with the hidden logistic model

    logit = b + sum_f  s_f * w_f[id_f]
              + sum_{(f,g) in PAIRS}  t_fg * <u_f[id_f], u_g[id_g]> / sqrt(R)

    w_f[id]    ~ N(0, 1)                 one weight per id
    u_f[id]    ~ N(0, I_R)               an R-dim factor per id (R = RANK = 2), for the
                                         fields that take part in an interaction

(b: BIAS, s_f: DEFAULT_SCALES, PAIRS/t_fg: DEFAULT_PAIRS). None of these is stored: every
w_f[id] and u_f[id][k] is a hash of (seed, field, id, k) (splitmix64, then Box-Muller), so a
10-million-id space costs no memory and every process computes the same model. The
interactions are what an embedding + MLP model can learn and a per-id linear model cannot.

With the defaults (seed 0): CTR about 0.40; the Bayes-optimal AUC, the AUC of the true
probabilities, is 0.821 on held-out data (0.814 and 0.862 with seeds 1 and 2: the few
popular ids of the small fields weigh a lot); of 2M training examples about 1.9% of the
held-out (example, field) ids never occur in training, and a quarter of the held-out
examples carry at least one id that training saw at most 5 times (run this file for the
numbers). The scales were tuned so that an embedding + MLP model trained on 2M examples
gets within 0.01 AUC of the optimum (examples/ctr.py), while a model of the four small
fields alone could not: the big fields' heads (a few thousand ids each, seen hundreds of
times) must be learnt.

The samples of a split are generated in blocks of BLOCK rows, block j from
numpy.random.default_rng([seed, split, j]): rows [begin, end) of a split are the same
whoever generates them, so each worker can generate only its own shard.

    generate(n, seed, split, begin=0, end=None) -> keys int64 [rows, F] (global keys),
                                                   labels float32 [rows],
                                                   true_probabilities float32 [rows]
    auc(labels, scores)            -> ROC AUC (rank based, ties averaged), numpy only
    bayes_auc(labels, probs)       -> the AUC of the generating model's probabilities
    key_space(), field_offsets()   -> K, offsets; seen_counts(...) -> held-out statistics
"""
import numpy as np

DEFAULT_SIZES = (4_000_000, 3_000_000, 2_000_000, 1_000_000, 100_000, 10_000, 1_000, 100)
DEFAULT_ZIPF = (1.25, 1.25, 1.25, 1.3, 1.3, 1.3, 1.3, 1.3)
# Per-field weight scales s_f. The four big fields (10 million ids) carry 8% of the logit's
# variance: the generating model without them ranks 0.019 AUC worse, twice what ctr.py
# accepts, while their long tails are what no finite sample can learn. The two smallest
# fields carry the most, as a user's country or a page's slot would.
DEFAULT_SCALES = (0.25, 0.25, 0.25, 0.25, 0.25, 0.35, 1.0, 1.0)
# (f, g, t_fg): low-rank interactions between the smaller fields.
DEFAULT_PAIRS = ((5, 6, 0.4), (5, 7, 0.4), (6, 7, 0.6))
RANK = 2
BIAS = -0.6
BLOCK = 1 << 16
SPLITS = {"train": 0, "test": 1, "valid": 2}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x):
    """splitmix64's finaliser of x + golden ratio, elementwise on uint64 (wraps)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint64) + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _hash(seed, field, stream, ids):
    """A 64-bit hash of (seed, field, stream, id) for each id."""
    h = _splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
    h = _splitmix64(h ^ np.uint64(field * 1_000_003 + 1))
    h = _splitmix64(h ^ np.uint64(stream + 0x51ED))
    return _splitmix64(h ^ np.asarray(ids, dtype=np.uint64))


def _normal(seed, field, stream, ids):
    """N(0, 1) per id, deterministic: two hashes -> two uniforms -> Box-Muller."""
    h1 = _hash(seed, field, 2 * stream, ids)
    h2 = _hash(seed, field, 2 * stream + 1, ids)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 2**53)  # (0, 1]
    u2 = (h2 >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)          # [0, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class Model:
    """The generating model: field sizes, Zipf exponents, scales, interactions, seed."""

    def __init__(self, seed=0, sizes=DEFAULT_SIZES, zipf=DEFAULT_ZIPF, scales=DEFAULT_SCALES,
                 pairs=DEFAULT_PAIRS, bias=BIAS, rank=RANK):
        if not len(sizes) == len(zipf) == len(scales):
            raise ValueError("sizes, zipf and scales need one entry per field")
        self.seed, self.bias, self.rank = int(seed), float(bias), int(rank)
        self.sizes = tuple(int(v) for v in sizes)
        self.zipf = tuple(float(a) for a in zipf)
        self.scales = tuple(float(s) for s in scales)
        self.pairs = tuple((int(f), int(g), float(t)) for f, g, t in pairs)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.key_space = int(sum(self.sizes))
        # The permutation rank -> id of each field: id = (m * (rank - 1) + c) mod V.
        self.perm = []
        for f, v in enumerate(self.sizes):
            h = int(_hash(self.seed, f, 999, 0))
            m = (h % v) | 1
            while np.gcd(m, v) != 1:
                m += 2
            self.perm.append((m % v, (h >> 32) % v))

    @property
    def num_fields(self):
        return len(self.sizes)

    def weights(self, field, ids):
        """s_f * w_f[id] for local ids of `field` (float64)."""
        return self.scales[field] * _normal(self.seed, field, 0, ids)

    def factors(self, field, ids):
        """u_f[id]: float64 [len(ids), rank]."""
        return np.stack([_normal(self.seed, field, 1 + k, ids) for k in range(self.rank)], 1)

    def logits(self, local_ids):
        """The true logit of each row of local ids (int64 [n, F], per-field ids)."""
        z = np.full(local_ids.shape[0], self.bias)
        for f in range(self.num_fields):
            z += self.weights(f, local_ids[:, f])
        cache = {}
        for f, g, t in self.pairs:
            for x in (f, g):
                if x not in cache:
                    cache[x] = self.factors(x, local_ids[:, x])
            z += t * np.einsum("nk,nk->n", cache[f], cache[g]) / np.sqrt(self.rank)
        return z

    def logits_without(self, local_ids, fields):
        """The true logit less the additive terms of `fields`: what a model blind to those
        fields could at best rank by (their interactions, if any, are kept)."""
        z = self.logits(local_ids)
        for f in fields:
            z -= self.weights(f, local_ids[:, f])
        return z

    def sample_ids(self, rng, n):
        """Local ids int64 [n, F]: truncated Zipf ranks through each field's permutation."""
        out = np.empty((n, self.num_fields), dtype=np.int64)
        for f, (v, a) in enumerate(zip(self.sizes, self.zipf)):
            ranks = np.empty(0, dtype=np.int64)
            while ranks.size < n:  # rejection: drop ranks beyond V_f
                r = rng.zipf(a, size=int((n - ranks.size) * 1.3) + 16)
                ranks = np.concatenate([ranks, r[r <= v]])
            m, c = self.perm[f]
            if v * v >= 2**63:
                raise ValueError(f"field {f}: {v} ids is too many for int64 arithmetic")
            out[:, f] = ((ranks[:n] - 1) * m + c) % v  # < v * v: exact in int64
        return out

    def rank_of(self, field, ids):
        """The Zipf rank (1 = most popular) of local ids of `field` (the inverse map)."""
        v = self.sizes[field]
        m, c = self.perm[field]
        inv = pow(int(m), -1, v)
        return ((np.asarray(ids, dtype=np.int64) - c) % v * inv) % v + 1

    def generate(self, n, split="train", begin=0, end=None):
        """Rows [begin, end) of the split's first n examples: (global keys int64 [rows, F],
        labels float32, true probabilities float32)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, not {split!r}")
        end = n if end is None else min(end, n)
        if not 0 <= begin <= end:
            raise ValueError(f"need 0 <= begin <= end <= n (begin {begin}, end {end}, n {n})")
        keys = np.empty((end - begin, self.num_fields), dtype=np.int64)
        labels = np.empty(end - begin, dtype=np.float32)
        probs = np.empty(end - begin, dtype=np.float32)
        for j in range(begin // BLOCK, (end + BLOCK - 1) // BLOCK if end > begin else 0):
            lo, hi = j * BLOCK, min((j + 1) * BLOCK, n)
            rng = np.random.default_rng([self.seed, SPLITS[split], j])
            ids = self.sample_ids(rng, hi - lo)
            p = 1.0 / (1.0 + np.exp(-self.logits(ids)))
            y = (rng.random(hi - lo) < p).astype(np.float32)
            a, b = max(lo, begin), min(hi, end)  # the part of this block asked for
            keys[a - begin:b - begin] = ids[a - lo:b - lo] + self.offsets
            labels[a - begin:b - begin] = y[a - lo:b - lo]
            probs[a - begin:b - begin] = p[a - lo:b - lo]
        return keys, labels, probs


def generate(n, seed=0, split="train", begin=0, end=None, **model_args):
    """(keys int64 [rows, F] as GLOBAL keys, labels float32 [rows], true_probabilities
    float32 [rows]) of rows [begin, end) (default all n) of `split` ("train", "test",
    "valid") under the generating model of `seed`."""
    return Model(seed, **model_args).generate(n, split, begin, end)


def key_space(**model_args):
    return Model(**model_args).key_space


def field_offsets(**model_args):
    return Model(**model_args).offsets


def auc(labels, scores):
    """ROC AUC of `scores` for binary `labels`: the Mann-Whitney statistic from ranks, tied
    scores getting their average rank. numpy only, O(n log n). NaN without both classes."""
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.size != s.size:
        raise ValueError(f"{y.size} labels but {s.size} scores")
    pos = int(y.sum())
    neg = y.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Tie groups: [start, end) runs of equal scores; their average rank (1-based).
    starts = np.flatnonzero(np.concatenate([[True], sorted_s[1:] != sorted_s[:-1]]))
    ends = np.concatenate([starts[1:], [s.size]])
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def bayes_auc(labels, probs):
    """The AUC of the generating model's own probabilities on these labels: what no model
    of the features can beat in expectation (the Bayes-optimal ranking)."""
    return auc(labels, probs)


def seen_counts(train_keys, test_keys):
    """How often each held-out key occurs in the training keys: int64 [rows, F]."""
    tk = np.asarray(train_keys).reshape(-1)
    uniq, counts = np.unique(tk, return_counts=True)
    q = np.asarray(test_keys)
    pos = np.searchsorted(uniq, q.reshape(-1))
    pos = np.minimum(pos, uniq.size - 1)
    found = uniq[pos] == q.reshape(-1)
    return np.where(found, counts[pos], 0).reshape(q.shape)


if __name__ == "__main__":  # a summary of the default data set
    import argparse
    import time
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", type=int, default=2_000_000)
    ap.add_argument("--test", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t = time.time()
    model = Model(args.seed)
    xtr, ytr, ptr = model.generate(args.train, "train")
    xte, yte, pte = model.generate(args.test, "test")
    print(f"generated {args.train} + {args.test} in {time.time() - t:.1f} s; key space "
          f"{model.key_space:,}; CTR train {ytr.mean():.4f} test {yte.mean():.4f}")
    big = [f for f in range(model.num_fields) if model.sizes[f] >= 1_000_000]
    print(f"Bayes AUC train {bayes_auc(ytr, ptr):.4f} test {bayes_auc(yte, pte):.4f}; test "
          f"AUC of the true logit without the fields {big} (>= 1M ids): "
          f"{auc(yte, model.logits_without(xte - model.offsets, big)):.4f}")
    c = seen_counts(xtr, xte)
    for f in range(model.num_fields):
        cf = c[:, f]
        print(f"field {f}: V={model.sizes[f]:>9,} a={model.zipf[f]} distinct in train "
              f"{np.unique(xtr[:, f]).size:>8,}; held-out ids seen 0x {np.mean(cf == 0):.3f} "
              f"1-5x {np.mean((cf >= 1) & (cf <= 5)):.3f} 6-50x "
              f"{np.mean((cf > 5) & (cf <= 50)):.3f} >50x {np.mean(cf > 50):.3f}")
    print(f"held-out (example, field) ids never seen in training: {np.mean(c == 0):.4f}; "
          f"seen 1-5 times: {np.mean((c >= 1) & (c <= 5)):.4f}")
