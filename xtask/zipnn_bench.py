"""ZipNN on the same XOR deltas as `cargo xtask bench delta`, one thread.

Usage: python zipnn_bench.py REFERENCE.safetensors TARGET.safetensors [REPS]
Prints one Markdown table row: ratio, compress MB/s, decompress MB/s, each speed the best
of REPS (default 3) passes over every tensor.
ZipNN's compress() mutates its input buffer, so every call gets a fresh copy.
"""
import json
import struct
import sys
import time

import warnings

warnings.filterwarnings("ignore")
import zipnn  # noqa: E402

DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def tensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], data[base + a : base + b])
    return out


def one_pass(deltas):
    """Compress and decompress every delta once: (packed bytes, compress s, decompress s)."""
    packed = 0
    enc_s = dec_s = 0.0
    for name, dtype, delta in deltas:
        z = zipnn.ZipNN(input_format="byte", bytearray_dtype=DTYPES[dtype], threads=1)
        buf = bytearray(delta)
        t0 = time.perf_counter()
        c = z.compress(buf)
        enc_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        d = z.decompress(bytes(c))
        dec_s += time.perf_counter() - t0
        if bytes(d) != delta:
            sys.exit(f"zipnn did not round-trip {name}")
        packed += len(c)
    return packed, enc_s, dec_s


def main():
    ref, tgt = tensors(sys.argv[1]), tensors(sys.argv[2])
    # Best of REPS whole passes, as the lockstep rows are timed (`best` in bench_table.rs).
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    deltas = []
    raw = 0
    for name, (dtype, x) in tgt.items():
        if dtype not in DTYPES:
            continue
        r = ref[name][1]
        delta = bytes(a ^ b for a, b in zip(r, x)) if len(x) < 4096 else (
            int.from_bytes(r, "little") ^ int.from_bytes(x, "little")
        ).to_bytes(len(x), "little")
        deltas.append((name, dtype, delta))
        raw += len(x)
    passes = [one_pass(deltas) for _ in range(reps)]
    packed = passes[0][0]
    enc_s = min(p[1] for p in passes)
    dec_s = min(p[2] for p in passes)
    print(
        f"| {'ZipNN (XOR delta), 1 thread':<28} | {packed / raw:>6.4f} | "
        f"{raw / enc_s / 1e6:>9.1f} | {raw / dec_s / 1e6:>9.1f} |"
    )


if __name__ == "__main__":
    main()
