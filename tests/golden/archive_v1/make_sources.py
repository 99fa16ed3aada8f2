# Writes the two tiny checkpoint directories packed into v1.lstp (see README.md).
# Plain Python, no numpy: bf16 = the top 16 bits of an fp32.
import json, os, struct

def bf16(x):
    return struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0])[2:]

def safetensors(path, tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)

def values(n, seed, step):
    s, out = seed, []
    for i in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(((s >> 40) / 2**24 - 0.5) * 0.05 + step * 1e-4 * ((i % 7) - 3))
    return out

for step in (100, 200):
    d = f"run/checkpoint-{step}"
    os.makedirs(d, exist_ok=True)
    safetensors(f"{d}/model.safetensors", [
        ("h.0.weight", "BF16", [16, 16], b"".join(bf16(v) for v in values(256, 1, step))),
        ("h.0.bias", "BF16", [16], b"".join(bf16(v) for v in values(16, 2, step))),
        ("ln.scale", "F32", [4], b"".join(struct.pack("<f", 1.0 + v) for v in values(4, 3, 0))),
    ])
    with open(f"{d}/config.json", "w") as f:
        f.write('{"model_type": "tiny", "hidden": 16}\n')
