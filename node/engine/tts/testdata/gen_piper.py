"""Generates testdata/piper-tiny.onnx and piper-tiny.onnx.json: a tiny,
random-weight model with the I/O of a Piper (VITS) voice export, for tests.

  input          int64   [1, T]   phoneme ids
  input_lengths  int64   [1]      T
  scales         float32 [3]      noise_scale, length_scale, noise_w
  sid            int64   [1]      speaker id
  output         float32 [1,1,S]  waveform, S = T * ceil(4 * length_scale) * 64

Like VITS, every phoneme lasts a number of frames that grows with
length_scale (here ceil(4 * length_scale) frames of 64 samples); each
sample is that phoneme's random amplitude times a sine whose frequency
depends on the speaker. No randomness at run time, so output is
deterministic. Run with /usr/bin/python3 (python3-onnx, python3-numpy).
"""
import json, os
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)

# Piper's symbol set layout: pad, bos, eos, space, punctuation, then IPA.
symbols = ["_", "^", "$", " ", "!", "'", "(", ")", ",", "-", ".", ":", ";", "?"]
symbols += list("abcdefhijklmnopqrstuvwxyz")
symbols += list("æçðøħŋœǀǁǂǃɐɑɒɓɔɕɖɗɘəɚɛɜɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢʲˈˌːˑ˞βθχᵻⱱ")
symbols += ["\u0303", "\u0329", "\u032a"]  # combining tilde, syllabic, dental
V = len(symbols)
id_map = {s: [i] for i, s in enumerate(symbols)}

amp = (0.2 + 0.6 * rng.random(V)).astype(np.float32)
amp[0] = 0.05  # pad is quiet

I = helper.make_tensor_value_info
nodes = [
    helper.make_node("Gather", ["amp", "input"], ["e2"], axis=0),             # [1,T]
    helper.make_node("Squeeze", ["e2", "ax0"], ["e"]),                          # [T]
    helper.make_node("Gather", ["scales", "one"], ["ls"], axis=0),              # scalar length_scale
    helper.make_node("Mul", ["ls", "four"], ["ls4"]),
    helper.make_node("Ceil", ["ls4"], ["lsc"]),
    helper.make_node("Cast", ["lsc"], ["nfr"], to=TensorProto.INT64),           # frames per phoneme
    helper.make_node("Mul", ["nfr", "hop"], ["per"]),                           # samples per phoneme
    helper.make_node("Squeeze", ["input_lengths", "ax0"], ["T"]),
    helper.make_node("Mul", ["T", "per"], ["S"]),
    helper.make_node("Range", ["zero", "S", "one"], ["t"]),                     # [S]
    helper.make_node("Div", ["t", "per"], ["idx"]),
    helper.make_node("Gather", ["e", "idx"], ["a"], axis=0),                    # [S]
    helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
    helper.make_node("Cast", ["sid"], ["sidf"], to=TensorProto.FLOAT),
    helper.make_node("Mul", ["sidf", "dw"], ["dws"]),
    helper.make_node("Add", ["w0", "dws"], ["w"]),
    helper.make_node("Mul", ["tf", "w"], ["ph"]),
    helper.make_node("Sin", ["ph"], ["s"]),
    helper.make_node("Mul", ["a", "s"], ["y"]),
    helper.make_node("Reshape", ["y", "oshape"], ["output"]),
]
inits = [
    numpy_helper.from_array(amp, "amp"),
    numpy_helper.from_array(np.array([0], np.int64), "ax0"),
    numpy_helper.from_array(np.array(1, np.int64), "one"),
    numpy_helper.from_array(np.array(0, np.int64), "zero"),
    numpy_helper.from_array(np.array(4.0, np.float32), "four"),
    numpy_helper.from_array(np.array(64, np.int64), "hop"),
    numpy_helper.from_array(np.array(0.06, np.float32), "w0"),
    numpy_helper.from_array(np.array([0.02], np.float32), "dw"),
    numpy_helper.from_array(np.array([1, 1, -1], np.int64), "oshape"),
]
graph = helper.make_graph(nodes, "piper_tiny", [
    I("input", TensorProto.INT64, [1, "T"]),
    I("input_lengths", TensorProto.INT64, [1]),
    I("scales", TensorProto.FLOAT, [3]),
    I("sid", TensorProto.INT64, [1]),
], [I("output", TensorProto.FLOAT, [1, 1, "S"])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="infermesh-testdata")
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, os.path.join(here, "piper-tiny.onnx"))

config = {
    "audio": {"sample_rate": 16000, "quality": "x_low"},
    "espeak": {"voice": "en-us"},
    "language": {"code": "en_US"},
    "inference": {"noise_scale": 0.667, "length_scale": 1, "noise_w": 0.8},
    "phoneme_type": "espeak",
    "phoneme_map": {},
    "phoneme_id_map": id_map,
    "num_symbols": V,
    "num_speakers": 2,
    "speaker_id_map": {"alice": 0, "bob": 1},
    "dataset": "tiny",
}
with open(os.path.join(here, "piper-tiny.onnx.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, ensure_ascii=False, indent=1)
