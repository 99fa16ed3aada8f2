"""Study (issue 19): what one joint symbol per weight (the `--fast` layout's J) would cost
under richer contexts that read the neighbor, priced as the encoder prices tables.

Usage: python3 scripts/joint_context_study.py [DIR] [bf16|fp32]   (DIR: the trajectory-gpt2
data, default ../shared/data/trajectory-gpt2)

For the 600 -> 800 pair: each tensor's J symbols (docs/FORMAT.md 1.2), its neighbor (the
element one last dimension earlier in the same chunk), and for each context scheme the ideal
code length under rows normalized to 4096, each context keeping its own row only where that
pays for the row's bytes against its backoff group's row (as `StageTable::select` prunes),
plus the raw tails. Prints the estimated ratio per scheme. An estimate, not a format: the
real `--fast` output is 0.3508 (bf16) where the first scheme prints 0.3523.
"""
import json
import struct
import sys
from collections import defaultdict

import numpy as np


def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8 : 8 + n])
    base = 8 + n
    return {
        k: (v["dtype"], v["shape"], b[base + v["data_offsets"][0] : base + v["data_offsets"][1]])
        for k, v in h.items()
        if k != "__metadata__"
    }


d = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/trajectory-gpt2"
dt = sys.argv[2] if len(sys.argv) > 2 else "bf16"
R = load(f"{d}/gpt2_step000600_{dt}.safetensors")
X = load(f"{d}/gpt2_step000800_{dt}.safetensors")
w = 16 if dt == "bf16" else 32
ut = np.uint16 if w == 16 else np.uint32
mant = 7 if w == 16 else 23
half = 1 << (w - 1)
A = 7 + 8 * (w - 2)  # J's alphabet
CHUNK = 262144


def key(u):
    """The ordered-integer map of docs/FORMAT.md 1.2."""
    u = u.astype(np.int64)
    return np.where(u < half, u ^ half, (~u) & ((1 << w) - 1))


def varint_len(x):
    return np.where(x < 128, 1, np.where(x < 16384, 2, 3))


def normalized(c):
    """Rows of counts -> frequencies summing to about 4096 (max(1, floor)): close enough to
    `entropy::freq::normalize` for pricing."""
    t = c.sum(1, keepdims=True)
    return np.where(c > 0, np.maximum(1, np.floor(c * 4096 / np.maximum(t, 1))), 0)


def row_bytes(f):
    k = (f > 0).sum(1)
    return 1 + 2 * k + (varint_len(f) * (f > 0)).sum(1)


def bits(c, f):
    p = np.where(f > 0, f, 1) / 4096.0
    return -(c * np.log2(p)).sum(1)


def pruned_bits(ctx, backoff, sym):
    """Code length plus table bytes, in bits, of `sym` under primary contexts `ctx` pruned
    against backoff rows `backoff` (a context keeps its row where that pays for it)."""
    u, inv = np.unique(ctx, return_inverse=True)
    C = np.zeros((len(u), A))
    np.add.at(C, (inv, sym), 1)
    group_of = np.zeros(len(u), np.int64)
    group_of[inv] = backoff
    groups, ginv = np.unique(group_of, return_inverse=True)
    G = np.zeros((len(groups), A))
    np.add.at(G, ginv, C)
    own = normalized(C)
    own_price = bits(C, own) + 8 * (row_bytes(own) + 1)
    keep = own_price < bits(C, normalized(G)[ginv])
    rest = np.zeros((len(groups), A))
    np.add.at(rest, ginv[~keep], C[~keep])
    rest_f = normalized(rest)
    used = rest.sum(1) > 0
    total = own_price[keep].sum() + bits(C[~keep], rest_f[ginv[~keep]]).sum()
    total += 8 * (row_bytes(rest_f[used]) + 1).sum()
    return total, keep.sum() + used.sum()


coded = defaultdict(float)
rows = defaultdict(int)
tail_bits = 0
n_total = 0
for name, (dtype, shape, rb) in R.items():
    if dtype not in ("BF16", "F32"):
        continue
    r = np.frombuffer(rb, ut)
    x = np.frombuffer(X[name][2], ut)
    n = len(r)
    n_total += n
    dd = (key(x) - key(r)) & ((1 << w) - 1)
    dd = np.where(dd >= half, dd - (1 << w), dd)
    v = np.abs(dd)
    neg = (dd < 0).astype(np.int64)
    b = np.zeros(n, np.int64)
    t = v.copy()
    while (t > 0).any():
        b += t > 0
        t >>= 1
    q1 = np.where(b >= 2, (v >> np.maximum(b - 2, 0)) & 1, 0)
    q2 = np.where(b >= 3, (v >> np.maximum(b - 3, 0)) & 1, 0)
    J = np.where(
        b == 0,
        0,
        np.where(b == 1, 1 + neg, np.where(b == 2, 3 + 2 * q1 + neg, 7 + 8 * (b - 3) + 4 * q1 + 2 * q2 + neg)),
    )
    tail_bits += np.maximum(b - 3, 0).sum()
    ru = r.astype(np.int64)
    er = (ru >> mant) & 0xFF
    rs = ru >> (w - 1)
    # The neighbor: one last dimension earlier (at least 32), in the same chunk.
    dist = shape[-1] if len(shape) >= 2 and shape[-1] >= 32 else 32
    inchunk = (np.arange(n) % CHUNK) >= dist

    def earlier(a, absent):
        o = np.full(n, absent, np.int64)
        if dist < n:
            o[dist:] = a[:-dist]
        return np.where(inchunk, o, absent)

    nb = earlier(b, w + 1)
    ner = earlier(er, 0)
    nup = earlier(np.where(b == 0, 0, 1 + neg), 0)
    # A predicted b: the neighbor's, moved by the exponent difference (0: no neighbor).
    pb = np.where(nb == w + 1, 0, np.clip(nb + ner - er + 1, 1, w + 1))
    K = w + 2
    schemes = {
        "er_rs (now)": (er * 2 + rs, rs),
        "er_rs_nb": ((er * 2 + rs) * K + nb, rs * K + nb),
        "er_rs_nb_up": (((er * 2 + rs) * K + nb) * 3 + nup, (rs * K + nb) * 3 + nup),
        "er_rs_pb": ((er * 2 + rs) * K + pb, rs * K + pb),
        "er_rs_pb_up": (((er * 2 + rs) * K + pb) * 3 + nup, (rs * K + pb) * 3 + nup),
        "rs_pb_up": ((rs * K + pb) * 3 + nup, (rs * K + pb) * 3 + nup),
    }
    for s, (ctx, backoff) in schemes.items():
        total, kept = pruned_bits(ctx, backoff, J)
        coded[s] += total
        rows[s] += kept
raw = n_total * w
for s in coded:
    print(f"{s:14s} J {coded[s] / 8 / 1e6:7.3f} MB rows {rows[s]:6d} ratio ~ {(coded[s] + tail_bits) / raw:.4f}")
