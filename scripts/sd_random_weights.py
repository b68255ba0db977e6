#!/usr/bin/env python3
"""Writes a Stable Diffusion model of the SDXS-512-DS layout with random weights.

No trained Stable Diffusion weights can be downloaded where Arcane's tests run, so
the tests drive stable-diffusion.cpp with a model that has the real layout (every
tensor sd.cpp expects, by name, shape and type) and weights drawn from a fixed seed.
Its pictures are noise; what the tests check (sizes, formats, the same bytes for the
same seed, step counts, cancellation, errors) does not depend on what they show.

    sd_random_weights.py LAYOUT OUT.safetensors

LAYOUT lists one tensor per line as stable-diffusion.cpp prints it:
`name n_dims ne0 ne1 ne2 ne3 type`, dimensions in ggml order (reversed here into
safetensors' row-major shape). The VAE (`first_stage_model.*`) is left out: this
layout decodes with its TAESD (`tae.*`). Matrices are F16, vectors F32; a vector
named `*.weight` is a norm's scale (1), `*.bias` a bias (0); everything else is
N(0, 0.02), the TAESD decoder N(0, 0.05) so that its output is visible noise.

Needs numpy only. Writes OUT.partial and renames it, so OUT is whole or absent.
The same LAYOUT gives the same bytes on every machine (numpy's PCG64, seed 20261206).
"""
import json
import os
import struct
import sys

import numpy as np

SEED = 20261206


def read_layout(path):
    tensors = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if not fields:
                continue
            name, n_dims = fields[0], int(fields[1])
            if name.startswith("first_stage_model."):
                continue
            ne = [int(x) for x in fields[2 : 2 + n_dims]]
            shape = list(reversed(ne))
            tensors.append((name, shape))
    return tensors


def values(rng, name, shape):
    count = int(np.prod(shape))
    if len(shape) == 1:
        fill = 1.0 if name.endswith(".weight") else 0.0
        return np.full(count, fill, dtype="<f4")
    scale = 0.05 if name.startswith("tae.decoder.") else 0.02
    return (rng.standard_normal(count, dtype=np.float32) * scale).astype("<f2")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: sd_random_weights.py LAYOUT OUT.safetensors")
    layout, out = sys.argv[1], sys.argv[2]
    tensors = read_layout(layout)
    header, offset = {}, 0
    for name, shape in tensors:
        dtype, width = ("F32", 4) if len(shape) == 1 else ("F16", 2)
        size = int(np.prod(shape)) * width
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt", "arcane": "random weights, seed %d" % SEED}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    rng = np.random.default_rng(SEED)
    partial = out + ".partial"
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name, shape in tensors:
            f.write(values(rng, name, shape).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, out)
    print("%s: %d tensors, %d bytes of weights" % (out, len(tensors), offset))


if __name__ == "__main__":
    main()
