#!/usr/bin/env python3
"""Writes tiny_nchw_x2.onnx, a stand-in with the I/O of the Real-ESRGAN
ONNX exports users pull elsewhere: input f32[1,3,H,W] RGB in 0..1 ->
output f32[1,3,2H,2W]. It computes nearest-neighbour x2 of the squared
input (out = x*x), so the expected pixels are known exactly and a wrong
layout, channel order or value range shows.

  /usr/bin/python3 node/engine/upscale/testdata/tiny_nchw.py node/engine/upscale/testdata/tiny_nchw_x2.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
nodes = [
    helper.make_node("Resize", ["image", "", "scales"], ["up"], mode="nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    helper.make_node("Mul", ["up", "up"], ["sr"]),
]
g = helper.make_graph(nodes, "tiny_nchw_x2",
                      [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "h", "w"])],
                      [helper.make_tensor_value_info("sr", TensorProto.FLOAT, [1, 3, "h2", "w2"])], [scales])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="infermesh test")
m.ir_version = 7
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
