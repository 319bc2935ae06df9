#!/usr/bin/env python3
"""Reference outputs for the converter test (converter_test.go), computed by
a plain numpy re-implementation of the Keras layers in the TF.js
model.json, independent of ONNX and of scripts/tfjs_layers2onnx.py.

Run from the repository root after scripts/assets-upscale.sh (which leaves
the npm tarball in the cache):

  tmp=$(mktemp -d) && tar -xzf ~/.cache/infermesh/npm/upscalerjs-esrgan-thick-1.0.0.tgz -C "$tmp" package/models/x2 package/models/x4
  /usr/bin/python3 node/engine/upscale/testdata/keras_ref.py "$tmp/package/models" node/engine/upscale/testdata

It writes ref_input.f32 (a 12x12 RGB crop of skimage's astronaut, 0..1,
NHWC float32 little-endian) and ref_x2.f32 / ref_x4.f32 (the models'
outputs for it, [1,24,24,3] and [1,48,48,3]).
"""
import json
import os
import sys
import zlib

import numpy as np


def weights(d, manifest):
    out = {}
    for g in manifest:
        blob = b"".join(open(os.path.join(d, p), "rb").read() for p in g["paths"])
        off = 0
        for w in g["weights"]:
            n = int(np.prod(w["shape"])) if w["shape"] else 1
            out[w["name"]] = np.frombuffer(blob, "<f4", n, off).reshape(w["shape"]).astype(np.float64)
            off += 4 * n
    return out


def conv_same(x, k, b):
    """Keras Conv2D, stride 1, 'same', NHWC x [H,W,Ci], kernel [kh,kw,Ci,Co]."""
    kh, kw = k.shape[:2]
    H, W, _ = x.shape
    p = np.pad(x, (((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2), (0, 0)))
    y = np.zeros((H, W, k.shape[3]))
    for i in range(kh):
        for j in range(kw):
            y += p[i:i + H, j:j + W, :] @ k[i, j]
    return y + b


def depth_to_space(x, s):
    """tf.depthToSpace NHWC: out[h*s+i, w*s+j, c] = x[h, w, (i*s+j)*C + c]."""
    H, W, D = x.shape
    c = D // (s * s)
    return x.reshape(H, W, s, s, c).transpose(0, 2, 1, 3, 4).reshape(H * s, W * s, c)


def run(model_dir, x):
    spec = json.load(open(os.path.join(model_dir, "model.json")))
    W = weights(model_dir, spec["weightsManifest"])
    layers = spec["modelTopology"]["model_config"]["config"]["layers"]
    t = {}
    for l in layers:
        k, c, n = l["class_name"], l["config"], l["name"]
        ins = [t[i[0]] for i in l["inbound_nodes"][0]] if l["inbound_nodes"] else []
        if k == "InputLayer":
            t[n] = x
        elif k == "Conv2D":
            y = conv_same(ins[0], W[n + "/kernel"], W[n + "/bias"])
            t[n] = np.maximum(y, 0) if c["activation"] == "relu" else y
        elif k == "Activation":
            assert c["activation"] == "relu"
            t[n] = np.maximum(ins[0], 0)
        elif k == "Concatenate":
            t[n] = np.concatenate(ins, axis=-1)
        elif k == "Add":
            t[n] = sum(ins)
        elif k == "MultiplyBeta":
            t[n] = ins[0] * 0.2
        elif k.startswith("PixelShuffle"):
            t[n] = depth_to_space(ins[0], c["scale"])
        else:
            raise SystemExit("unexpected layer " + k)
    return t[layers[-1]["name"]]


def astronaut_crop():
    """12x12 crop of the astronaut's face, decoded with zlib (no PIL)."""
    path = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png"
    data = open(path, "rb").read()
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        ln = int.from_bytes(data[pos:pos + 4], "big")
        typ = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + ln]
        if typ == b"IHDR":
            w, bpp = int.from_bytes(body[:4], "big"), {2: 3, 6: 4}[body[9]]
        if typ == b"IDAT":
            idat += body
        pos += 12 + ln
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for r in range(len(raw) // (stride + 1)):
        f, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, cc = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - cc), abs(a - cc), abs(a + b - 2 * cc)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else cc)) & 255
        rows.append(bytes(line))
        prev = line
        if r >= 120:
            break
    img = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), w, bpp)[:, :, :3]
    return img[100:112, 200:212].astype(np.float32) / 255.0


if __name__ == "__main__":
    models, out = sys.argv[1], sys.argv[2]
    x = astronaut_crop()
    x.astype("<f4").tofile(os.path.join(out, "ref_input.f32"))
    for s in (2, 4):
        y = run(os.path.join(models, "x%d" % s), x.astype(np.float64))
        y.astype("<f4").tofile(os.path.join(out, "ref_x%d.f32" % s))
        print("x%d" % s, y.shape, float(y.min()), float(y.max()))
