"""Generates the small ONNX test models of node/engine/vision's tests.

Run from the repository root with Debian's python3-onnx and python3-numpy:

    /usr/bin/python3 node/engine/vision/testdata/gen_models.py node/engine/vision/testdata

Each model has the exact input and output names, element types and ranks of
a real export that cannot be downloaded here, with tiny weights (fixed
seeds, so the bytes are the same on every run) or planted outputs that the
tests decode and compare exactly:

  yolo_planted.onnx   Ultralytics YOLOv8/YOLO11 detection export: images
                      f32[1,3,640,640] -> output0 f32[1,84,8400]; output0 is
                      all zeros but for three planted anchors (see PLANTED).
  yolo_random.onnx    the same I/O; three 1x1 convolutions with random
                      weights on the image average-pooled at strides 8, 16
                      and 32, sigmoid, concatenated like the real heads.
  scrfd_planted.onnx  insightface SCRFD (det_10g layout): input.1
                      f32[1,3,640,640] -> 9 outputs, scores [N,1], box
                      distances [N,4], keypoints [N,10] for strides 8, 16,
                      32 (N = 12800, 3200, 800; det_10g's output names), all
                      zero but for the anchors of SCRFD_PLANTED.
  arcface_pool.onnx   ArcFace/MobileFaceNet I/O: input.1 f32[N,3,112,112] ->
                      683 f32[N,512]; the "embedding" is the aligned crop's
                      R and G channels average-pooled 7x7 (2x16x16 = 512),
                      so a test can see whether alignment worked.
  florence/           Florence-2 (onnx-community export for transformers.js):
                      vision_encoder.onnx   pixel_values f32[b,3,768,768] ->
                                            image_features f32[b,577,D]
                      embed_tokens.onnx     input_ids i64[b,t] ->
                                            inputs_embeds f32[b,t,D]
                      encoder_model.onnx    inputs_embeds f32[b,s,D],
                                            attention_mask i64[b,s] ->
                                            last_hidden_state f32[b,s,D]
                      decoder_model_merged.onnx  encoder_attention_mask
                                            i64[b,es], encoder_hidden_states
                                            f32[b,es,D], inputs_embeds
                                            f32[b,t,D], use_cache_branch
                                            bool[1], past_key_values.{l}.
                                            {decoder,encoder}.{key,value}
                                            f32[b,H,p,Dh] -> logits f32[b,t,V],
                                            present.{l}.* (an If node on
                                            use_cache_branch passes the
                                            encoder cache through, as the
                                            merged export does)
                      decoder_planted.onnx  the same decoder whose logits
                                            also add 100 x a one-hot row
                                            chosen by the cache length, so
                                            greedy decoding spells PLANTED_TEXT
                      tokenizer.json        byte-level BPE with BART's special
                                            tokens (<s> 0, <pad> 1, </s> 2,
                                            <unk> 3) and RobertaProcessing
                      generation_config.json
                      Tiny sizes: D 16, H 2, Dh 8, 2 layers (Florence-2-base is
                      D 768, H 12, Dh 64, 6 layers, vocabulary 51289).
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13

# Planted YOLO anchors: (anchor index, cx, cy, w, h, class, score). The
# second overlaps the first (same class, IoU 0.83) and must be suppressed;
# the third is another class, below the default threshold 0.25.
PLANTED = [
    (1234, 320.0, 300.0, 200.0, 100.0, 16, 0.9),
    (1235, 322.0, 302.0, 200.0, 110.0, 16, 0.6),
    (5000, 100.0, 200.0, 50.0, 50.0, 2, 0.2),
]


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="infermesh-testgen")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def zero_dependence(input_name, out_name, prefix):
    """Nodes computing 0 * mean(input) as a [1,1,1] tensor, so a planted
    output still depends on (and so needs) the model input."""
    return [
        helper.make_node("ReduceMean", [input_name], [prefix + "_mean"], keepdims=0),
        helper.make_node("Mul", [prefix + "_mean", prefix + "_zero"], [out_name]),
    ], [const(prefix + "_zero", np.float32(0))]


def yolo_planted(path):
    out = np.zeros((1, 84, 8400), np.float32)
    for a, cx, cy, w, h, c, s in PLANTED:
        out[0, 0:4, a] = [cx, cy, w, h]
        out[0, 4 + c, a] = s
    # ScatterND into zeros keeps the file small.
    idx, upd = [], []
    for a, cx, cy, w, h, c, s in PLANTED:
        for row, v in zip([0, 1, 2, 3, 4 + c], [cx, cy, w, h, s]):
            idx.append([0, row, a])
            upd.append(v)
    nodes, inits = zero_dependence("images", "dep", "z")
    nodes += [
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])),
        helper.make_node("ScatterND", ["zeros", "idx", "upd"], ["planted"]),
        helper.make_node("Add", ["planted", "dep"], ["output0"]),
    ]
    inits += [const("shape", np.array([1, 84, 8400], np.int64)), const("idx", np.array(idx, np.int64)),
              const("upd", np.array(upd, np.float32))]
    g = helper.make_graph(nodes, "yolo_planted",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 640, 640])],
                          [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 84, 8400])], inits)
    save(g, path)


def yolo_random(path):
    rng = np.random.default_rng(8)
    nodes, inits, heads = [], [], []
    for s in (8, 16, 32):
        n = (640 // s) ** 2
        nodes += [
            helper.make_node("AveragePool", ["images"], [f"p{s}"], kernel_shape=[s, s], strides=[s, s]),
            helper.make_node("Conv", [f"p{s}", f"w{s}", f"b{s}"], [f"c{s}"]),
            helper.make_node("Reshape", [f"c{s}", f"shape{s}"], [f"h{s}"]),
        ]
        inits += [const(f"w{s}", rng.normal(0, 2, (84, 3, 1, 1)).astype(np.float32)),
                  const(f"b{s}", rng.normal(-2, 1, (84,)).astype(np.float32)),
                  const(f"shape{s}", np.array([1, 84, n], np.int64))]
        heads.append(f"h{s}")
    nodes += [helper.make_node("Concat", heads, ["cat"], axis=2), helper.make_node("Sigmoid", ["cat"], ["sig"]),
              # Boxes in input pixels: scale rows 0-3 by 640.
              helper.make_node("Mul", ["sig", "scale"], ["output0"])]
    scale = np.ones((1, 84, 1), np.float32)
    scale[0, :4, 0] = 640
    inits.append(const("scale", scale))
    g = helper.make_graph(nodes, "yolo_random",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 640, 640])],
                          [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 84, 8400])], inits)
    save(g, path)


# SCRFD planted anchors: (stride, anchor index, score, distances l t r b in
# stride units, 5 keypoint offsets in stride units). Stride 16, cell
# (x 20, y 10), anchors 1 and 0: centre (320, 160). The second overlaps the
# first and is suppressed; the third scores below 0.5.
SCRFD_PLANTED = [
    (16, (10 * 40 + 20) * 2 + 1, 0.95, [3, 4, 5, 6], [-1, -1, 1, -1, 0, 0, -0.8, 1, 0.8, 1]),
    (16, (10 * 40 + 20) * 2, 0.7, [3, 4, 5, 5.5], [-1, -1, 1, -1, 0, 0, -0.8, 1, 0.8, 1]),
    (8, 100, 0.3, [1, 1, 1, 1], [0] * 10),
]
SCRFD_NAMES = ["448", "471", "494", "451", "474", "497", "454", "477", "500"]


def scrfd_planted(path):
    nodes, inits = zero_dependence("input.1", "dep", "z")
    nodes.append(helper.make_node("Reshape", ["dep", "shape2"], ["dep2"]))
    inits.append(const("shape2", np.array([1, 1], np.int64)))
    outputs = []
    for k, (kind, width) in enumerate([("score", 1), ("bbox", 4), ("kps", 10)]):
        for j, s in enumerate((8, 16, 32)):
            n = (640 // s) ** 2 * 2
            name = SCRFD_NAMES[3 * k + j]
            idx, upd = [], []
            for ps, a, score, dist, kps in SCRFD_PLANTED:
                if ps != s:
                    continue
                vals = {"score": [score], "bbox": dist, "kps": kps}[kind]
                for c, v in enumerate(vals):
                    idx.append([a, c])
                    upd.append(v)
            base = f"{kind}{s}"
            nodes.append(helper.make_node("ConstantOfShape", [base + "_shape"], [base + "_zeros"],
                                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])))
            inits.append(const(base + "_shape", np.array([n, width], np.int64)))
            src = base + "_zeros"
            if idx:
                nodes.append(helper.make_node("ScatterND", [src, base + "_idx", base + "_upd"], [base + "_planted"]))
                inits += [const(base + "_idx", np.array(idx, np.int64)), const(base + "_upd", np.array(upd, np.float32))]
                src = base + "_planted"
            nodes.append(helper.make_node("Add", [src, "dep2"], [name]))
            outputs.append(vi(name, TensorProto.FLOAT, [n, width]))
    g = helper.make_graph(nodes, "scrfd_planted", [vi("input.1", TensorProto.FLOAT, [1, 3, 640, 640])], outputs, inits)
    save(g, path)


def arcface_pool(path):
    nodes = [
        helper.make_node("AveragePool", ["input.1"], ["pool"], kernel_shape=[7, 7], strides=[7, 7]),
        helper.make_node("Slice", ["pool", "starts", "ends", "axes"], ["rg"]),
        helper.make_node("Flatten", ["rg"], ["683"], axis=1),
    ]
    inits = [const("starts", np.array([0], np.int64)), const("ends", np.array([2], np.int64)), const("axes", np.array([1], np.int64))]
    g = helper.make_graph(nodes, "arcface_pool", [vi("input.1", TensorProto.FLOAT, ["None", 3, 112, 112])],
                          [vi("683", TensorProto.FLOAT, ["None", 512])], inits)
    save(g, path)


FL_D, FL_H, FL_DH, FL_LAYERS = 16, 2, 8, 2
PLANTED_TEXT = "A cat."


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 byte values."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def florence_tokenizer(path):
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials)}
    b2u = bytes_to_unicode()
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    merges = ["\u0120 c", "a t"]
    for m in merges:
        vocab[m.replace(" ", "")] = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                           "trim_offsets": True, "add_prefix_space": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
    with open(path, "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    return vocab


def vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def florence_vision(path, rng):
    D = FL_D
    nodes = [
        helper.make_node("AveragePool", ["pixel_values"], ["pool"], kernel_shape=[32, 32], strides=[32, 32]),
        helper.make_node("Conv", ["pool", "w"], ["conv"]),
        helper.make_node("Reshape", ["conv", "shape"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1]),
        helper.make_node("ReduceMean", ["tokens"], ["pooled"], axes=[1], keepdims=1),
        helper.make_node("Concat", ["pooled", "tokens"], ["image_features"], axis=1),
    ]
    inits = [const("w", rng.normal(0, 1, (D, 3, 1, 1)).astype(np.float32)), const("shape", np.array([0, D, 576], np.int64))]
    g = helper.make_graph(nodes, "florence_vision", [vi("pixel_values", TensorProto.FLOAT, ["batch_size", 3, 768, 768])],
                          [vi("image_features", TensorProto.FLOAT, ["batch_size", 577, D])], inits)
    save(g, path)


def florence_embed(path, rng, V):
    g = helper.make_graph([helper.make_node("Gather", ["table", "input_ids"], ["inputs_embeds"])], "florence_embed",
                          [vi("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
                          [vi("inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", FL_D])],
                          [const("table", rng.normal(0, 1, (V, FL_D)).astype(np.float32))])
    save(g, path)


def florence_encoder(path, rng):
    nodes = [
        helper.make_node("MatMul", ["inputs_embeds", "w"], ["mm"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"]),
        helper.make_node("Mul", ["mm", "mask3"], ["masked"]),
        helper.make_node("Tanh", ["masked"], ["last_hidden_state"]),
    ]
    g = helper.make_graph(nodes, "florence_encoder",
                          [vi("inputs_embeds", TensorProto.FLOAT, ["batch_size", "encoder_sequence_length", FL_D]),
                           vi("attention_mask", TensorProto.INT64, ["batch_size", "encoder_sequence_length"])],
                          [vi("last_hidden_state", TensorProto.FLOAT, ["batch_size", "encoder_sequence_length", FL_D])],
                          [const("w", rng.normal(0, 0.5, (FL_D, FL_D)).astype(np.float32)), const("axis", np.array([2], np.int64))])
    save(g, path)


def florence_decoder(path, rng, V, planted_ids=None):
    D, H, DH, L = FL_D, FL_H, FL_DH, FL_LAYERS
    nodes, inits = [], [const("heads", np.array([0, 0, H, DH], np.int64)), const("axis1", np.array([1], np.int64)),
                        const("dshape", np.array([0, 1, D], np.int64))]
    kv = ["batch_size", H, "past_decoder_sequence_length", DH]
    ekv = ["batch_size", H, "encoder_sequence_length_out", DH]
    inputs = [vi("encoder_attention_mask", TensorProto.INT64, ["batch_size", "encoder_sequence_length"]),
              vi("encoder_hidden_states", TensorProto.FLOAT, ["batch_size", "encoder_sequence_length", D]),
              vi("inputs_embeds", TensorProto.FLOAT, ["batch_size", "decoder_sequence_length", D])]
    outputs = [vi("logits", TensorProto.FLOAT, ["batch_size", "decoder_sequence_length", V])]

    def heads(x, w, out):
        nodes.extend([helper.make_node("MatMul", [x, w], [out + "_mm"]),
                      helper.make_node("Reshape", [out + "_mm", "heads"], [out + "_r"]),
                      helper.make_node("Transpose", [out + "_r"], [out], perm=[0, 2, 1, 3])])
        inits.append(const(w, rng.normal(0, 0.5, (D, D)).astype(np.float32)))

    for l in range(L):
        for part in ("decoder.key", "decoder.value", "encoder.key", "encoder.value"):
            inputs.append(vi(f"past_key_values.{l}.{part}", TensorProto.FLOAT, kv if part.startswith("decoder") else ekv))
            outputs.append(vi(f"present.{l}.{part}", TensorProto.FLOAT,
                              ["batch_size", H, "past_decoder_sequence_length + 1", DH] if part.startswith("decoder") else ekv))
        for kind in ("key", "value"):
            heads("inputs_embeds", f"wd{l}{kind}", f"new{l}{kind}")
            nodes.append(helper.make_node("Concat", [f"past_key_values.{l}.decoder.{kind}", f"new{l}{kind}"],
                                          [f"present.{l}.decoder.{kind}"], axis=2))
            # Cross-attention cache: computed at the first step, passed
            # through afterwards.
            then_g = helper.make_graph([helper.make_node("Identity", [f"past_key_values.{l}.encoder.{kind}"], [f"t{l}{kind}"])],
                                       f"then{l}{kind}", [], [vi(f"t{l}{kind}", TensorProto.FLOAT, ekv)])
            sub = []
            inits.append(const(f"we{l}{kind}", rng.normal(0, 0.5, (D, D)).astype(np.float32)))
            sub += [helper.make_node("MatMul", ["encoder_hidden_states", f"we{l}{kind}"], [f"e{l}{kind}_mm"]),
                    helper.make_node("Reshape", [f"e{l}{kind}_mm", "heads"], [f"e{l}{kind}_r"]),
                    helper.make_node("Transpose", [f"e{l}{kind}_r"], [f"e{l}{kind}"], perm=[0, 2, 1, 3])]
            else_g = helper.make_graph(sub, f"else{l}{kind}", [], [vi(f"e{l}{kind}", TensorProto.FLOAT, ekv)])
            nodes.append(helper.make_node("If", ["use_cache_branch"], [f"present.{l}.encoder.{kind}"],
                                          then_branch=then_g, else_branch=else_g))
    inputs.insert(3, vi("use_cache_branch", TensorProto.BOOL, [1]))
    # h = tanh(embeds + mean cross-attention values of layer 0 + mean of the
    # decoder's own values so far), logits = h W.
    for name, src in (("encmean", "present.0.encoder.value"), ("decmean", f"present.{L - 1}.decoder.value")):
        nodes += [helper.make_node("ReduceMean", [src], [name + "_m"], axes=[2], keepdims=1),
                  helper.make_node("Transpose", [name + "_m"], [name + "_t"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [name + "_t", "dshape"], [name])]
    nodes += [helper.make_node("Add", ["inputs_embeds", "encmean"], ["h1"]),
              helper.make_node("Add", ["h1", "decmean"], ["h2"]),
              helper.make_node("Tanh", ["h2"], ["h"]),
              helper.make_node("MatMul", ["h", "wout"], ["random_logits"])]
    inits.append(const("wout", rng.normal(0, 3, (D, V)).astype(np.float32)))
    if planted_ids is None:
        nodes.append(helper.make_node("Identity", ["random_logits"], ["logits"]))
    else:
        steps = 64
        table = np.zeros((steps, V), np.float32)
        for i in range(steps):
            table[i, planted_ids[i] if i < len(planted_ids) else 2] = 100.0
        nodes += [helper.make_node("Shape", ["past_key_values.0.decoder.key"], ["pshape"]),
                  helper.make_node("Gather", ["pshape", "two"], ["plen"], axis=0),
                  helper.make_node("Gather", ["table", "plen"], ["row"], axis=0),
                  helper.make_node("Add", ["random_logits", "row"], ["logits"])]
        inits += [const("two", np.array(2, np.int64)), const("table", table)]
    g = helper.make_graph(nodes, "florence_decoder", inputs, outputs, inits)
    save(g, path)


def florence(out):
    os.makedirs(out, exist_ok=True)
    vocab = florence_tokenizer(f"{out}/tokenizer.json")
    V = len(vocab)
    b2u = bytes_to_unicode()
    enc = lambda s: "".join(b2u[b] for b in s.encode())
    planted = [0, vocab["A"], vocab[enc(" c")], vocab["at"], vocab["."], 2]
    with open(f"{out}/generation_config.json", "w") as f:
        json.dump({"decoder_start_token_id": 2, "eos_token_id": 2, "forced_bos_token_id": 0,
                   "no_repeat_ngram_size": 3, "pad_token_id": 1, "bos_token_id": 0}, f, indent=1)
    rng = np.random.default_rng(2)
    florence_vision(f"{out}/vision_encoder.onnx", rng)
    florence_embed(f"{out}/embed_tokens.onnx", rng, V)
    florence_encoder(f"{out}/encoder_model.onnx", rng)
    florence_decoder(f"{out}/decoder_model_merged.onnx", np.random.default_rng(3), V)
    florence_decoder(f"{out}/decoder_planted.onnx", np.random.default_rng(3), V, planted)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    yolo_planted(f"{out}/yolo_planted.onnx")
    yolo_random(f"{out}/yolo_random.onnx")
    scrfd_planted(f"{out}/scrfd_planted.onnx")
    arcface_pool(f"{out}/arcface_pool.onnx")
    florence(f"{out}/florence")
