"""safetensors files with NumPy only (the engine's checkpoints, for
state_dict and load_state_dict): an 8-byte little-endian header length, the
JSON header, the data. BF16 data reads as float32 (exact) without torch."""
import json
import struct

import numpy as np

_NP = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


def read(path):
    """(tensors: {name: (dtype name, shape, bytes)}, metadata: {str: str}),
    tensors in file order."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        a, b = e["data_offsets"]
        tensors[name] = (e["dtype"], tuple(e["shape"]), blob[base + a:base + b])
    return tensors, meta


def to_numpy(dtype, shape, data):
    """A tensor's bytes as a NumPy array (BF16 widened to float32, exactly)."""
    if dtype == "BF16":
        half = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return half.view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=_NP[dtype]).reshape(shape).copy()


def write(path, tensors, metadata):
    """tensors: a list of (name, dtype name, shape, bytes)."""
    header, off = {"__metadata__": dict(metadata)}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, _, data in tensors:
            f.write(data)
