"""Generates testdata/openvoice-tiny/: tiny random-weight models with the
I/O of the OpenVoice v2 tone-colour converter ONNX export (the
openvoice_tone_clone_onnx layout used by MeloTTS-ONNX), for tests.

  tone_color_extract_model.onnx
    input   float32 [1, F, 513]   linear magnitude spectrogram frames
    -> tone float32 [1, 256]      tone colour (speaker embedding)
  tone_clone_model.onnx
    audio        float32 [1, 513, F]
    audio_length int64   [1]       F
    src_tone     float32 [1, 256, 1]
    dest_tone    float32 [1, 256, 1]
    tau          float32 [1]
    -> output    float32 [1, 1, F*256]   waveform at 22050 Hz
  configuration.json    the converter's hyper-parameters (data.*)

The converter's output depends on the spectrogram and on dest_tone -
src_tone, so a different reference voice changes the audio. Run with
/usr/bin/python3 (python3-onnx, python3-numpy).
"""
import json, os
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openvoice-tiny")
os.makedirs(here, exist_ok=True)
rng = np.random.default_rng(11)
I = helper.make_tensor_value_info
K, G, HOP = 513, 256, 256
B = 64  # the random weights see only the lowest B bins, to keep the files small
band = [numpy_helper.from_array(np.array([0], np.int64), "b0"), numpy_helper.from_array(np.array([B], np.int64), "b1"),
        numpy_helper.from_array(np.array([2], np.int64), "ax2")]

def save(nodes, name, ins, outs, inits):
    g = helper.make_graph(nodes, name, ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="infermesh-testdata")
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(here, name + ".onnx"))

# Extractor: mean log-magnitude over frames, projected, tanh.
save([
    helper.make_node("Slice", ["input", "b0", "b1", "ax2"], ["low"]),          # [1,F,64]
    helper.make_node("Log", ["low"], ["lg"]),
    helper.make_node("ReduceMean", ["lg"], ["mean"], axes=[1], keepdims=0),   # [1,64]
    helper.make_node("MatMul", ["mean", "we"], ["proj"]),                       # [1,256]
    helper.make_node("Tanh", ["proj"], ["tone"]),
], "tone_color_extract_model",
    [I("input", TensorProto.FLOAT, [1, "F", K])], [I("tone", TensorProto.FLOAT, [1, G])],
    [numpy_helper.from_array((rng.standard_normal((B, G)) * 0.2).astype(np.float32), "we"), *band])

# Converter: per frame, project the spectrum to HOP samples, shift by the
# tone difference times tau, squash.
save([
    helper.make_node("Transpose", ["audio"], ["at"], perm=[0, 2, 1]),           # [1,F,513]
    helper.make_node("Slice", ["at", "b0", "b1", "ax2"], ["low"]),             # [1,F,64]
    helper.make_node("Log", ["low"], ["lg"]),
    helper.make_node("MatMul", ["lg", "wf"], ["fr"]),                           # [1,F,256]
    helper.make_node("Sub", ["dest_tone", "src_tone"], ["d"]),                  # [1,256,1]
    helper.make_node("Reshape", ["d", "dshape"], ["d2"]),                       # [1,1,256]
    helper.make_node("Mul", ["d2", "wd"], ["dd"]),                              # [1,1,256]
    helper.make_node("Mul", ["dd", "tau"], ["dt"]),
    helper.make_node("Add", ["fr", "dt"], ["s"]),
    helper.make_node("Tanh", ["s"], ["y"]),
    helper.make_node("Mul", ["y", "gain"], ["yg"]),
    helper.make_node("Reshape", ["yg", "oshape"], ["output"]),
], "tone_clone_model", [
    I("audio", TensorProto.FLOAT, [1, K, "F"]),
    I("audio_length", TensorProto.INT64, [1]),
    I("src_tone", TensorProto.FLOAT, [1, G, 1]),
    I("dest_tone", TensorProto.FLOAT, [1, G, 1]),
    I("tau", TensorProto.FLOAT, [1]),
], [I("output", TensorProto.FLOAT, [1, 1, "S"])], [
    numpy_helper.from_array((rng.standard_normal((B, HOP)) * 0.1).astype(np.float32), "wf"),
    numpy_helper.from_array((rng.standard_normal(G) * 2).astype(np.float32), "wd"), *band,
    numpy_helper.from_array(np.array([1, 1, G], np.int64), "dshape"),
    numpy_helper.from_array(np.array(0.3, np.float32), "gain"),
    numpy_helper.from_array(np.array([1, 1, -1], np.int64), "oshape"),
])

with open(os.path.join(here, "configuration.json"), "w") as f:
    json.dump({"data": {"sampling_rate": 22050, "filter_length": 1024, "hop_length": HOP, "win_length": 1024},
               "model": {"gin_channels": G}}, f, indent=1)
