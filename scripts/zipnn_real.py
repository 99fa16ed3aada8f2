#!/usr/bin/env python3
"""Real ZipNN 0.5 on whole checkpoint files, for the archive report (not used by tests).

ZipNN imports torch at module level but its byte-input path does not use it; to avoid a
5.6 GB download, put a stand-in `torch.py` (scripts/torch_stub/torch.py) on PYTHONPATH:

    python3 -m venv /tmp/zvenv && /tmp/zvenv/bin/pip install numpy zstandard safetensors
    /tmp/zvenv/bin/pip install --no-deps zipnn
    PYTHONPATH=scripts/torch_stub /tmp/zvenv/bin/python scripts/zipnn_real.py FILE...

dtype is taken from the name (bf16 / fp32). Prints bytes in, bytes out, ratio, and checks
that decompression gives the input back.
"""
import sys
import zipnn

total_in = total_out = 0
for path in sys.argv[1:]:
    dtype = "bfloat16" if "bf16" in path else "float32"
    data = open(path, "rb").read()
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype)
    c = z.compress(bytearray(data))  # zipnn may mutate its input: pass a copy
    back = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype).decompress(c)
    ok = bytes(back) == data
    total_in += len(data)
    total_out += len(c)
    print(f"{path}: {len(data)} -> {len(c)} ({len(c) / len(data):.4f}) roundtrip {'ok' if ok else 'FAILED'}")
print(f"total: {total_in} -> {total_out} ({total_out / max(total_in, 1):.4f})")
