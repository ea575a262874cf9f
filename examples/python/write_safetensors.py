"""A muon checkpoint written with NumPy only (no torch, no safetensors
package): one Muon parameter "w" (2 x 3) with a zero momentum buffer at
step 3, without checksums, so it loads with eng:load(path, { checksum =
false }) (C: mu_engine_load_ex(eng, path, MU_LOAD_NO_CHECKSUM)).

    python3 examples/python/write_safetensors.py [PATH]   (default: from_python.safetensors)
"""
import json
import struct
import sys

import numpy as np


def write_safetensors(path, tensors, metadata):  # tensors: {name: float32/float64 array}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": {"float32": "F32", "float64": "F64"}[a.dtype.name],
                        "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


state = [{"prefix": "muon/", "kind": "muon", "groups": [{"step": 3}],
          "params": [{"name": "w", "shape": [2, 3], "dtype": "float32", "group": 1}]}]
write_safetensors(sys.argv[1] if len(sys.argv) > 1 else "from_python.safetensors",
                  {"muon/w/momentum_buffer": np.zeros((2, 3), np.float32)},
                  {"muon.state": json.dumps(state), "muon.engine.step": "3", "muon.engine.lr_scale": "1"})
