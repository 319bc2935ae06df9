#!/usr/bin/env python3
"""Convert a TF.js *layers* model (a Keras Functional model saved by
tensorflowjs) to ONNX, for infermesh's in-process ONNX Runtime.

Usage: tfjs_layers2onnx.py MODEL.json OUT.onnx

The ONNX model takes `input` f32[1,H,W,C] (NHWC, the Keras layout, in the
model's own value range) and gives `output` f32[1,H',W',C'] (NHWC); inside,
the graph runs NCHW, which is what ONNX Runtime's convolutions want.

Layers handled (what UpscalerJS' ESRGAN/RDN/RRDN models and similar
image-to-image networks use):
  InputLayer, Conv2D (stride 1, any dilation, 'same'/'valid', with a fused
  activation), Activation (linear/relu/sigmoid/tanh/elu/selu/softplus/swish),
  ReLU, LeakyReLU, Add, Subtract, Multiply, Average, Concatenate,
  UpSampling2D (nearest, bilinear), ZeroPadding2D, and the UpscalerJS custom
  layers MultiplyBeta (x*beta, beta 0.2) and PixelShuffle<N>x
  (tf.depthToSpace NHWC, which on NCHW is ONNX DepthToSpace in DCR mode).
Anything else stops the conversion with the layer's class name.

Weights may be float32, or quantized float16/uint8/uint16 (dequantized to
float32). The output is deterministic: the same model.json and shards give
byte-identical ONNX, so its sha256 can be pinned.
Needs python3-onnx and python3-numpy.
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


def read_weights(model_dir, manifest):
    """Return {weight name: float32/int32 array} from the manifest's shards."""
    out = {}
    for group in manifest:
        blob = b"".join(open(os.path.join(model_dir, p), "rb").read() for p in group["paths"])
        pos = 0
        for w in group["weights"]:
            count = 1
            for d in w["shape"]:
                count *= d
            q = w.get("quantization")
            if q:
                qt = {"float16": np.float16, "uint8": np.uint8, "uint16": np.uint16}[q["dtype"]]
                raw = np.frombuffer(blob, qt, count, pos)
                pos += raw.nbytes
                if q["dtype"] == "float16":
                    arr = raw.astype(np.float32)
                else:
                    arr = raw.astype(np.float32) * np.float32(q["scale"]) + np.float32(q["min"])
            else:
                dt = {"float32": np.float32, "int32": np.int32}[w["dtype"]]
                arr = np.frombuffer(blob, dt, count, pos)
                pos += arr.nbytes
            out[w["name"]] = arr.reshape(w["shape"])
    return out


class Graph:
    """Accumulates ONNX nodes and initializers with unique names."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, kind, ins, out, **attrs):
        self.nodes.append(helper.make_node(kind, ins, [out], name=out + "/" + kind, **attrs))
        return out

    def activation(self, act, x, out, alpha=None):
        """Apply a Keras activation by name to x, writing out."""
        simple = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "elu": "Elu", "selu": "Selu", "softplus": "Softplus"}
        if act in (None, "linear"):
            return self.op("Identity", [x], out)
        if act in simple:
            return self.op(simple[act], [x], out)
        if act == "leaky_relu":
            return self.op("LeakyRelu", [x], out, alpha=float(0.3 if alpha is None else alpha))
        if act == "swish":
            s = self.op("Sigmoid", [x], out + "_sig")
            return self.op("Mul", [x, s], out)
        raise SystemExit("tfjs_layers2onnx: unsupported activation " + str(act))


def inbound(layer):
    nodes = layer.get("inbound_nodes") or []
    if len(nodes) != 1:
        raise SystemExit("tfjs_layers2onnx: layer %s is shared or unconnected; not supported" % layer["name"])
    return [n[0] for n in nodes[0]]


def convert_layer(g, layer, weights):
    kind, cfg, name = layer["class_name"], layer["config"], layer["name"]
    ins = inbound(layer)
    if kind == "Conv2D":
        if cfg.get("strides", [1, 1]) != [1, 1] or cfg.get("groups", 1) != 1:
            raise SystemExit("tfjs_layers2onnx: Conv2D %s: only stride 1, groups 1" % name)
        kh, kw = cfg["kernel_size"]
        dh, dw = cfg.get("dilation_rate", [1, 1])
        # Keras 'same' pads (k-1)*d, the extra pixel at the end.
        eh, ew = (kh - 1) * dh, (kw - 1) * dw
        pads = [eh // 2, ew // 2, eh - eh // 2, ew - ew // 2] if cfg["padding"] == "same" else [0, 0, 0, 0]
        kernel = weights[name + "/kernel"].astype(np.float32).transpose(3, 2, 0, 1)  # HWIO -> OIHW
        conv_ins = [ins[0], g.const(name + "/W", kernel)]
        if cfg.get("use_bias", True):
            conv_ins.append(g.const(name + "/B", weights[name + "/bias"].astype(np.float32)))
        act = cfg.get("activation", "linear")
        y = name if act in (None, "linear") else name + "/pre"
        g.op("Conv", conv_ins, y, kernel_shape=[kh, kw], pads=pads, dilations=[dh, dw], strides=[1, 1])
        if y != name:
            g.activation(act, y, name)
    elif kind == "Activation":
        g.activation(cfg["activation"], ins[0], name)
    elif kind == "ReLU":
        if cfg.get("max_value") is not None or cfg.get("threshold", 0) or cfg.get("negative_slope", 0):
            raise SystemExit("tfjs_layers2onnx: ReLU %s with options is not supported" % name)
        g.op("Relu", ins, name)
    elif kind == "LeakyReLU":
        g.activation("leaky_relu", ins[0], name, cfg.get("alpha", 0.3))
    elif kind in ("Add", "Multiply"):
        onnx_op = {"Add": "Sum", "Multiply": "Mul"}[kind]
        if onnx_op == "Mul" and len(ins) > 2:
            acc = ins[0]
            for i, x in enumerate(ins[1:-1]):
                acc = g.op("Mul", [acc, x], "%s/m%d" % (name, i))
            g.op("Mul", [acc, ins[-1]], name)
        else:
            g.op(onnx_op, ins, name)
    elif kind == "Subtract":
        g.op("Sub", ins, name)
    elif kind == "Average":
        g.op("Mean", ins, name)
    elif kind == "Concatenate":
        axis = cfg.get("axis", -1)
        if axis not in (-1, 3):
            raise SystemExit("tfjs_layers2onnx: Concatenate %s on axis %s" % (name, axis))
        g.op("Concat", ins, name, axis=1)  # NHWC channels -> NCHW axis 1
    elif kind == "UpSampling2D":
        sh, sw = cfg["size"]
        scales = g.const(name + "/scales", np.array([1, 1, sh, sw], np.float32))
        if cfg.get("interpolation", "nearest") == "nearest":
            g.op("Resize", [ins[0], "", scales], name, mode="nearest",
                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        else:
            g.op("Resize", [ins[0], "", scales], name, mode="linear", coordinate_transformation_mode="half_pixel")
    elif kind == "ZeroPadding2D":
        (t, b), (l, r) = cfg["padding"]
        g.op("Pad", [ins[0], g.const(name + "/pads", np.array([0, 0, t, l, 0, 0, b, r], np.int64))], name)
    elif kind == "MultiplyBeta":
        g.op("Mul", [ins[0], g.const(name + "/beta", np.array(cfg.get("beta", 0.2), np.float32))], name)
    elif kind.startswith("PixelShuffle"):
        scale = cfg.get("scale") or int(kind[len("PixelShuffle"):].rstrip("x"))
        g.op("DepthToSpace", ins, name, blocksize=int(scale), mode="DCR")
    else:
        raise SystemExit("tfjs_layers2onnx: unsupported layer %s (%s)" % (kind, name))


def convert(model_json, out_path):
    spec = json.load(open(model_json))
    topo = spec["modelTopology"]
    cfg = (topo.get("model_config") or topo)["config"]
    layers = cfg["layers"]
    weights = read_weights(os.path.dirname(os.path.abspath(model_json)), spec["weightsManifest"])
    inputs = [l for l in layers if l["class_name"] == "InputLayer"]
    if len(inputs) != 1 or len(cfg.get("output_layers", [[0]])) != 1:
        raise SystemExit("tfjs_layers2onnx: only models with one input and one output")
    in_name = inputs[0]["name"]
    channels = inputs[0]["config"]["batch_input_shape"][-1]
    g = Graph()
    g.op("Transpose", ["input"], in_name, perm=[0, 3, 1, 2])
    for layer in layers:
        if layer["class_name"] != "InputLayer":
            convert_layer(g, layer, weights)
    last = cfg["output_layers"][0][0] if cfg.get("output_layers") else layers[-1]["name"]
    g.op("Transpose", [last], "output", perm=[0, 2, 3, 1])
    graph = helper.make_graph(
        g.nodes, os.path.basename(os.path.dirname(os.path.abspath(model_json))) or "model",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "height", "width", channels])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, "out_height", "out_width", None])],
        g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="infermesh tfjs_layers2onnx")
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, out_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    convert(sys.argv[1], sys.argv[2])
