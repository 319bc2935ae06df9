#!/usr/bin/python3
"""Generate tiny Stable Diffusion pipelines (random weights) for tests.

Usage: /usr/bin/python3 testdata/models/gen_tiny_sd.py MODELS_DIR
       /usr/bin/python3 testdata/models/gen_tiny_sd.py --bench MODELS_DIR

Writes four model folders under MODELS_DIR, each with the component graphs
of the diffusers/Optimum ONNX export of an SD 1.5 / SD-Turbo class pipeline,
with the export's exact input and output names and layouts but tiny
channel counts (so one denoising step takes milliseconds):

  tiny-sd          flat folder, fp32: text encoder (input_ids int32
                   [batch,77] -> last_hidden_state [batch,77,32]), a
                   4-channel UNet (sample, timestep int64 [batch],
                   encoder_hidden_states -> out_sample), VAE encoder
                   (sample -> latent_sample) and decoder (latent_sample ->
                   sample), a safety checker (clip_input, images ->
                   out_images, has_nsfw_concepts), Euler ancestral
                   scheduler, classifier-free guidance 5 over 3 steps.
  tiny-sd-inpaint  flat, fp32, a 9-channel inpainting UNet with a float
                   timestep, Euler scheduler.
  tiny-sd-pix2pix  flat, fp32, an 8-channel InstructPix2Pix UNet, DDIM.
  tiny-sd-turbo    the diffusers sub-folder layout (model_index.json,
                   tokenizer/, text_encoder/model.onnx, ...), every graph in
                   float16, LCM one-step; its UNet takes ControlNet
                   residuals, with controlnet/canny and controlnet/depth
                   ControlNets and a depth estimator (pixel_values ->
                   predicted_depth).

With --bench it writes only MODELS_DIR/bench-sd, for the denoising-step
benchmark (not for tests): the same flat fp32 layout as tiny-sd (Euler
ancestral, guidance 7.5) with a 768-wide text encoder and a UNet of SD 1.5's
channel widths (320/640/1280, GroupNorm, a cross-attention block over the
text, 8 heads) but one block per level, so a step costs a realistic share of
a real SD UNet's (about 15 GFLOP per image at 64x64 latents; 100 MB).

The tokenizer is CLIP's layout (vocab.json + merges.txt: 256 byte symbols,
the same with "</w>", merges of the words below, then <|startoftext|> and
<|endoftext|>). tokenizer_expected.json holds encodings computed here with
CLIP's reference BPE algorithm, for the Go tokenizer's parity test.

The safety checker flags an image when the mean of its first clip_input
channel is above 0.5 (a very red image): a rule a test can predict.

Needs only onnx and numpy. The output is the same on every run; a re-run
whose output already exists does nothing.
"""

import json
import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20250117
OPSET = 17
HIDDEN = 32
SEQ = 77
LATENT = 4
FEAT = 8
VERSION = "3"
BENCH_VERSION = "1"

WORDS = """
a an the of and in on with at by to from photo picture painting drawing
portrait landscape cat dog bird horse fish tree flower mountain river sea sky
sun moon star city street house room car boat red green blue yellow white
black orange purple pink brown gray bright dark small large big tiny old new
beautiful detailed realistic cartoon style oil watercolor sketch digital art
make it turn into snow winter summer night day happy sad man woman child face
""".split()


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def build_vocab():
    b2u = bytes_to_unicode()
    syms = list(b2u.values())
    vocab = syms + [s + "</w>" for s in syms]
    merges = []
    seen = set()
    for w in WORDS:
        chars = [b2u[b] for b in w.encode()]
        chars[-1] += "</w>"
        cur = chars[0]
        for c in chars[1:]:
            m = (cur, c)
            if m not in seen:
                seen.add(m)
                merges.append(m)
                vocab.append(cur + c)
            cur = cur + c
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(vocab)}, merges


def clip_bpe(token, ranks):
    """CLIP's reference BPE: merge the lowest-ranked adjacent pair, all its
    occurrences, until no ranked pair is left."""
    word = list(token[:-1]) + [token[-1] + "</w>"]
    while len(word) > 1:
        pairs = set(zip(word, word[1:]))
        best = min(pairs, key=lambda p: ranks.get(p, 1 << 30))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


PAT = re.compile(r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+|\d|[^\s\w]+|_+",
                 re.IGNORECASE)


def clip_encode(text, vocab, merges, pad_id):
    ranks = {m: i for i, m in enumerate(merges)}
    b2u = bytes_to_unicode()
    text = " ".join(text.split()).strip().lower()
    ids = [vocab["<|startoftext|>"]]
    for tok in PAT.findall(text):
        u = "".join(b2u[b] for b in tok.encode())
        ids += [vocab[t] for t in clip_bpe(u, ranks)]
    ids = ids[:SEQ - 1] + [vocab["<|endoftext|>"]]
    return ids + [pad_id] * (SEQ - len(ids))


class G:
    """A graph under construction."""

    def __init__(self, rng, dtype):
        self.rng, self.dtype = rng, dtype
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, p):
        self.n += 1
        return "%s_%d" % (p, self.n)

    def w(self, shape, scale=None, value=None):
        if value is None:
            fan = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            scale = scale if scale is not None else 1.0 / np.sqrt(max(fan, 1))
            value = self.rng.standard_normal(shape) * scale
        n = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=self.dtype), n))
        return n

    def c(self, value, dtype=None):
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.dtype), n))
        return n

    def op(self, typ, ins, **kw):
        out = self.name(typ.lower())
        self.nodes.append(helper.make_node(typ, ins, [out], **kw))
        return out

    def conv(self, x, cin, cout, k):
        return self.op("Conv", [x, self.w([cout, cin, k, k]), self.w([cout], 0.1)], pads=[k // 2] * 4)

    def silu(self, x):
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def cast(self, x, to):
        return self.op("Cast", [x], to=to)

    def save(self, path, inputs, outputs, out_names):
        for src, dst in zip(out_names, [o.name for o in outputs]):
            self.nodes.append(helper.make_node("Identity", [src], [dst]))
        g = helper.make_graph(self.nodes, os.path.basename(os.path.dirname(path)) or "g", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="gen_tiny_sd")
        m.ir_version = 8
        onnx.checker.check_model(m)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        onnx.save(m, path)


def ft(dtype):
    return TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT


def text_encoder(path, rng, dtype, vocab_size, hidden=HIDDEN):
    g = G(rng, dtype)
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "sequence"])
    emb = g.op("Gather", [g.w([vocab_size, hidden], 1.0), g.op("Cast", ["input_ids"], to=TensorProto.INT64)])
    x = g.op("Add", [emb, g.w([SEQ, hidden], 0.5)])
    # Causal-ish mixing: each position also sees the running mean.
    x = g.op("Add", [x, g.op("Div", [g.op("CumSum", [x, g.c(np.array(1, np.int64), np.int64)]),
                                     g.c(np.arange(1, SEQ + 1).reshape(SEQ, 1))])])
    x = g.op("LayerNormalization", [x, g.w([hidden], value=np.ones(hidden)), g.w([hidden], value=np.zeros(hidden))], axis=-1)
    h = g.op("Tanh", [g.op("MatMul", [x, g.w([hidden, hidden])])])
    pooled = g.op("ReduceMean", [h], axes=[1], keepdims=0)
    t = ft(dtype)
    g.save(path, [ids], [helper.make_tensor_value_info("last_hidden_state", t, ["batch", "sequence", hidden]),
                         helper.make_tensor_value_info("pooler_output", t, ["batch", hidden])], [h, pooled])


def timestep_embed(g, ts_type):
    """[batch] timestep of any type -> [batch, FEAT, 1, 1] float feature."""
    t = g.cast("timestep", ft(g.dtype)) if ts_type != ft(g.dtype) else "timestep"
    t = g.op("Mul", [t, g.c(1.0 / 1000)])
    t = g.op("Unsqueeze", [t, g.c(np.array([1], np.int64), np.int64)])  # [b,1]
    e = g.op("Sin", [g.op("MatMul", [t, g.w([1, FEAT], 3.0)])])  # [b,FEAT]
    return g.op("Unsqueeze", [e, g.c(np.array([2, 3], np.int64), np.int64)])


def unet(path, rng, dtype, cin, ts_type, control):
    g = G(rng, dtype)
    t = ft(dtype)
    ins = [helper.make_tensor_value_info("sample", t, ["batch", cin, "height", "width"]),
           helper.make_tensor_value_info("timestep", ts_type, ["batch"]),
           helper.make_tensor_value_info("encoder_hidden_states", t, ["batch", "sequence", HIDDEN])]
    h = g.conv("sample", cin, FEAT, 3)
    h = g.op("Add", [h, timestep_embed(g, ts_type)])
    ctx = g.op("ReduceMean", ["encoder_hidden_states"], axes=[1], keepdims=0)  # [b,H]
    ctx = g.op("Unsqueeze", [g.op("MatMul", [ctx, g.w([HIDDEN, FEAT], 2.0)]), g.c(np.array([2, 3], np.int64), np.int64)])
    h = g.silu(g.op("Add", [h, ctx]))
    if control:
        ins += [helper.make_tensor_value_info("down_block_additional_residual_0", t, ["batch", FEAT, "height", "width"]),
                helper.make_tensor_value_info("mid_block_additional_residual", t, ["batch", FEAT, "height", "width"])]
        h = g.op("Add", [h, "down_block_additional_residual_0"])
        h = g.op("Add", [g.silu(g.conv(h, FEAT, FEAT, 3)), "mid_block_additional_residual"])
    out = g.conv(h, FEAT, LATENT, 3)
    # Predicted noise: a residual from the noisy latent's own channels.
    base = g.op("Slice", ["sample", g.c(np.array([0], np.int64), np.int64), g.c(np.array([LATENT], np.int64), np.int64),
                          g.c(np.array([1], np.int64), np.int64)])
    out = g.op("Add", [g.op("Mul", [base, g.c(0.5)]), g.op("Mul", [out, g.c(0.5)])])
    g.save(path, ins, [helper.make_tensor_value_info("out_sample", t, ["batch", LATENT, "height", "width"])], [out])


def controlnet(path, rng, dtype, ts_type):
    g = G(rng, dtype)
    t = ft(dtype)
    ins = [helper.make_tensor_value_info("sample", t, ["batch", LATENT, "height", "width"]),
           helper.make_tensor_value_info("timestep", ts_type, ["batch"]),
           helper.make_tensor_value_info("encoder_hidden_states", t, ["batch", "sequence", HIDDEN]),
           helper.make_tensor_value_info("controlnet_cond", t, ["batch", 3, "image_height", "image_width"]),
           helper.make_tensor_value_info("conditioning_scale", t, [1])]
    cond = g.conv(g.op("SpaceToDepth", ["controlnet_cond"], blocksize=8), 3 * 64, FEAT, 1)
    h = g.silu(g.op("Add", [g.conv("sample", LATENT, FEAT, 3), g.op("Add", [cond, timestep_embed(g, ts_type)])]))
    d = g.op("Mul", [g.conv(h, FEAT, FEAT, 3), "conditioning_scale"])
    m = g.op("Mul", [g.conv(h, FEAT, FEAT, 1), "conditioning_scale"])
    g.save(path, ins, [helper.make_tensor_value_info("down_block_res_sample_0", t, ["batch", FEAT, "height", "width"]),
                       helper.make_tensor_value_info("mid_block_res_sample", t, ["batch", FEAT, "height", "width"])], [d, m])


def vae_decoder(path, rng, dtype):
    g = G(rng, dtype)
    t = ft(dtype)
    h = g.silu(g.conv("latent_sample", LATENT, 3 * 64, 1))
    h = g.op("DepthToSpace", [h], blocksize=8, mode="DCR")
    h = g.op("Tanh", [g.op("Mul", [g.conv(h, 3, 3, 3), g.c(2.0)])])
    g.save(path, [helper.make_tensor_value_info("latent_sample", t, ["batch", LATENT, "height", "width"])],
           [helper.make_tensor_value_info("sample", t, ["batch", 3, "image_height", "image_width"])], [h])


def vae_encoder(path, rng, dtype):
    g = G(rng, dtype)
    t = ft(dtype)
    h = g.op("SpaceToDepth", ["sample"], blocksize=8)
    h = g.conv(h, 3 * 64, LATENT, 1)
    g.save(path, [helper.make_tensor_value_info("sample", t, ["batch", 3, "height", "width"])],
           [helper.make_tensor_value_info("latent_sample", t, ["batch", LATENT, "latent_height", "latent_width"])], [h])


def safety_checker(path, rng, dtype):
    g = G(rng, dtype)
    t = ft(dtype)
    red = g.op("Slice", ["clip_input", g.c(np.array([0], np.int64), np.int64), g.c(np.array([1], np.int64), np.int64),
                         g.c(np.array([1], np.int64), np.int64)])
    score = g.op("ReduceMean", [red], axes=[1, 2, 3], keepdims=0)  # [b]
    flag = g.op("Greater", [score, g.c(0.5)])
    keep = g.op("Cast", [g.op("Not", [flag])], to=t)
    out = g.op("Mul", ["images", g.op("Unsqueeze", [keep, g.c(np.array([1, 2, 3], np.int64), np.int64)])])
    g.save(path, [helper.make_tensor_value_info("clip_input", t, ["batch", 3, 224, 224]),
                  helper.make_tensor_value_info("images", t, ["batch", "height", "width", 3])],
           [helper.make_tensor_value_info("out_images", t, ["batch", "height", "width", 3]),
            helper.make_tensor_value_info("has_nsfw_concepts", TensorProto.BOOL, ["batch"])], [out, flag])


def depth_estimator(path, rng, dtype, size):
    g = G(rng, dtype)
    t = ft(dtype)
    h = g.silu(g.conv("pixel_values", 3, FEAT, 3))
    h = g.op("Squeeze", [g.conv(h, FEAT, 1, 3), g.c(np.array([1], np.int64), np.int64)])
    g.save(path, [helper.make_tensor_value_info("pixel_values", t, [1, 3, size, size])],
           [helper.make_tensor_value_info("predicted_depth", t, [1, size, size])], [h])


SCHEDULERS = {
    "euler_a": {"_class_name": "EulerAncestralDiscreteScheduler", "timestep_spacing": "leading", "steps_offset": 1},
    "euler": {"_class_name": "EulerDiscreteScheduler", "timestep_spacing": "linspace", "steps_offset": 1},
    "ddim": {"_class_name": "DDIMScheduler", "timestep_spacing": "leading", "steps_offset": 1, "clip_sample": False,
             "set_alpha_to_one": False},
    "lcm": {"_class_name": "LCMScheduler", "timestep_spacing": "trailing", "steps_offset": 1,
            "original_inference_steps": 50, "timestep_scaling": 10.0},
}


def scheduler_config(kind):
    c = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", "num_train_timesteps": 1000,
         "prediction_type": "epsilon"}
    c.update(SCHEDULERS[kind])
    return c


def write_json(path, v):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(v, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def pipeline(root, name, cin, dtype, ts_type, sched, options, flat, control=False, safety=True):
    rng = np.random.default_rng(SEED + cin)
    d = os.path.join(root, name)
    vocab, merges = build_vocab()
    files = {}

    def place(role, flatname, sub):
        files[role] = flatname
        return os.path.join(d, flatname if flat else sub)

    write_json(place("vocab", "vocab.json", "tokenizer/vocab.json"), vocab)
    with open(place("merges", "merges.txt", "tokenizer/merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "".join("%s %s\n" % m for m in merges))
    write_json(place("tokenizer_config", "tokenizer_config.json", "tokenizer/tokenizer_config.json"),
               {"model_max_length": SEQ, "pad_token": "<|endoftext|>" if flat else "!",
                "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "do_lower_case": True})
    write_json(place("scheduler", "scheduler_config.json", "scheduler/scheduler_config.json"), scheduler_config(sched))
    write_json(place("vae_config", "vae_config.json", "vae_decoder/config.json"), {"scaling_factor": 0.18215,
                                                                                    "latent_channels": LATENT})
    text_encoder(place("text_encoder", "text_encoder.onnx", "text_encoder/model.onnx"), rng, dtype, len(vocab))
    unet(place("unet", "unet.onnx", "unet/model.onnx"), rng, dtype, cin, ts_type, control)
    vae_decoder(place("vae_decoder", "vae_decoder.onnx", "vae_decoder/model.onnx"), rng, dtype)
    vae_encoder(place("vae_encoder", "vae_encoder.onnx", "vae_encoder/model.onnx"), rng, dtype)
    index = {"_class_name": "OnnxStableDiffusionPipeline", "_diffusers_version": "0.25.0",
             "text_encoder": ["diffusers", "OnnxRuntimeModel"], "unet": ["diffusers", "OnnxRuntimeModel"],
             "vae_decoder": ["diffusers", "OnnxRuntimeModel"], "vae_encoder": ["diffusers", "OnnxRuntimeModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "scheduler": ["diffusers", SCHEDULERS[sched]["_class_name"]]}
    if safety:
        safety_checker(place("safety_checker", "safety_checker.onnx", "safety_checker/model.onnx"), rng, dtype)
        index["safety_checker"] = ["diffusers", "OnnxRuntimeModel"]
    if control:
        for kind in ("canny", "depth"):
            controlnet(place("controlnet_" + kind, "controlnet_%s.onnx" % kind, "controlnet/%s/model.onnx" % kind),
                       rng, dtype, ts_type)
        depth_estimator(place("depth_estimator", "depth_estimator.onnx", "depth_estimator/model.onnx"), rng, dtype, 56)
    write_json(place("model_index", "model_index.json", "model_index.json"), index)
    ids = {t: clip_encode(t, vocab, merges, vocab["<|endoftext|>"] if flat else vocab["!"])
           for t in ["a photo of a cat", "A  Beautiful   painting, of the SEA at night!", "turn it into winter's snow 42",
                     "zebra's xylophone", ""]}
    write_json(os.path.join(d, "tokenizer_expected.json"), ids)
    manifest = {"id": "onnx/%s/test" % name,
                "name": name, "tag": "test", "task": "image-generation", "modalities": ["image-generation"],
                "description": "Random-weight test pipeline in the SD ONNX export layout (gen_tiny_sd.py)",
                "license": "MIT", "source": "testdata/models/gen_tiny_sd.py", "files": files if flat else
                {"model_index": "model_index.json"}, "options": options}
    write_json(os.path.join(d, "manifest.json"), manifest)
    with open(os.path.join(d, "VERSION"), "w") as f:
        f.write(VERSION + "\n")


BENCH_CH = (320, 640, 1280)
BENCH_HIDDEN = 768
BENCH_HEADS = 8


def bench_unet(path, rng, dtype):
    """A UNet with SD 1.5's widths and layer kinds, one block per level:
    conv_in, two stride-2 down convs, a cross-attention block at the
    lowest level, 1x1 convs with DepthToSpace up, skips, conv_out."""
    g = G(rng, dtype)
    t = ft(dtype)
    c1, c2, c3 = BENCH_CH
    ins = [helper.make_tensor_value_info("sample", t, ["batch", LATENT, "height", "width"]),
           helper.make_tensor_value_info("timestep", TensorProto.INT64, ["batch"]),
           helper.make_tensor_value_info("encoder_hidden_states", t, ["batch", "sequence", BENCH_HIDDEN])]
    i64 = lambda *v: g.c(np.array(v, np.int64), np.int64)  # noqa: E731

    def gnorm(x, c):
        # GroupNorm(32) as SD's ONNX exports write it at opset 17.
        y = g.op("Reshape", [x, i64(0, 32, -1)])
        y = g.op("InstanceNormalization", [y, g.w([32], value=np.ones(32)), g.w([32], value=np.zeros(32))])
        y = g.op("Reshape", [y, g.op("Shape", [x])])
        return g.op("Add", [g.op("Mul", [y, g.w([c, 1, 1], value=np.ones((c, 1, 1)))]), g.w([c, 1, 1], 0.02)])

    def down(x, cin, cout):
        return g.op("Conv", [g.silu(gnorm(x, cin)), g.w([cout, cin, 3, 3]), g.w([cout], 0.1)], pads=[1] * 4,
                    strides=[2, 2])

    def up(x, cin, cout):
        y = g.op("Conv", [g.silu(gnorm(x, cin)), g.w([4 * cout, cin, 1, 1]), g.w([4 * cout], 0.1)])
        return g.op("DepthToSpace", [y], blocksize=2, mode="DCR")

    tt = g.op("Unsqueeze", [g.op("Mul", [g.cast("timestep", t), g.c(1.0 / 1000)]), i64(1)])
    temb = g.silu(g.op("MatMul", [g.op("Sin", [g.op("MatMul", [tt, g.w([1, c1], 3.0)])]), g.w([c1, c3])]))

    def add_temb(x, c):
        e = g.op("Unsqueeze", [g.op("MatMul", [temb, g.w([c3, c])]), i64(2, 3)])
        return g.op("Add", [x, e])

    h1 = add_temb(g.conv("sample", LATENT, c1, 3), c1)  # [b,320,H,W]
    h2 = add_temb(down(h1, c1, c2), c2)  # [b,640,H/2,W/2]
    h3 = add_temb(down(h2, c2, c3), c3)  # [b,1280,H/4,W/4]
    # Cross-attention over the text, SD's layout (proj_in, q from the
    # picture, k and v from the text, 8 heads, out, proj_out).
    d = c3 // BENCH_HEADS
    x = g.op("Transpose", [g.op("Reshape", [gnorm(h3, c3), i64(0, c3, -1)])], perm=[0, 2, 1])  # [b,hw,C]
    x = g.op("MatMul", [x, g.w([c3, c3])])
    q = g.op("Transpose", [g.op("Reshape", [g.op("MatMul", [x, g.w([c3, c3])]), i64(0, -1, BENCH_HEADS, d)])],
             perm=[0, 2, 1, 3])
    k = g.op("Transpose", [g.op("Reshape", [g.op("MatMul", ["encoder_hidden_states", g.w([BENCH_HIDDEN, c3])]),
                                            i64(0, -1, BENCH_HEADS, d)])], perm=[0, 2, 3, 1])
    v = g.op("Transpose", [g.op("Reshape", [g.op("MatMul", ["encoder_hidden_states", g.w([BENCH_HIDDEN, c3])]),
                                            i64(0, -1, BENCH_HEADS, d)])], perm=[0, 2, 1, 3])
    a = g.op("Softmax", [g.op("Mul", [g.op("MatMul", [q, k]), g.c(1.0 / np.sqrt(d))])], axis=-1)
    o = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [a, v])], perm=[0, 2, 1, 3]), i64(0, -1, c3)])
    o = g.op("Add", [g.op("MatMul", [o, g.w([c3, c3])]), x])
    o = g.op("MatMul", [o, g.w([c3, c3])])
    o = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1]), g.op("Shape", [h3])])
    h3 = g.op("Add", [h3, o])
    u2 = g.op("Add", [up(h3, c3, c2), h2])
    u1 = g.op("Add", [up(u2, c2, c1), h1])
    out = g.op("Conv", [g.silu(gnorm(u1, c1)), g.w([LATENT, c1, 3, 3], 0.01), g.w([LATENT], 0.01)], pads=[1] * 4)
    out = g.op("Add", [g.op("Mul", ["sample", g.c(0.5)]), out])
    g.save(path, ins, [helper.make_tensor_value_info("out_sample", t, ["batch", LATENT, "height", "width"])], [out])


def bench_pipeline(root):
    """bench-sd: tiny-sd's layout and scheduler with an SD-sized UNet."""
    name = "bench-sd"
    rng = np.random.default_rng(SEED + 1000)
    d = os.path.join(root, name)
    vocab, merges = build_vocab()
    write_json(os.path.join(d, "vocab.json"), vocab)
    with open(os.path.join(d, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n" + "".join("%s %s\n" % m for m in merges))
    write_json(os.path.join(d, "tokenizer_config.json"), {"model_max_length": SEQ, "pad_token": "<|endoftext|>",
                                                           "bos_token": "<|startoftext|>",
                                                           "eos_token": "<|endoftext|>", "do_lower_case": True})
    write_json(os.path.join(d, "scheduler_config.json"), scheduler_config("euler_a"))
    write_json(os.path.join(d, "vae_config.json"), {"scaling_factor": 0.18215, "latent_channels": LATENT})
    text_encoder(os.path.join(d, "text_encoder.onnx"), rng, np.float32, len(vocab), BENCH_HIDDEN)
    bench_unet(os.path.join(d, "unet.onnx"), rng, np.float32)
    vae_decoder(os.path.join(d, "vae_decoder.onnx"), rng, np.float32)
    files = {"vocab": "vocab.json", "merges": "merges.txt", "tokenizer_config": "tokenizer_config.json",
             "scheduler": "scheduler_config.json", "vae_config": "vae_config.json",
             "text_encoder": "text_encoder.onnx", "unet": "unet.onnx", "vae_decoder": "vae_decoder.onnx"}
    write_json(os.path.join(d, "model_index.json"), {"_class_name": "OnnxStableDiffusionPipeline"})
    write_json(os.path.join(d, "manifest.json"), {
        "id": "onnx/%s/test" % name, "name": name, "tag": "test", "task": "image-generation",
        "modalities": ["image-generation"],
        "description": "Random-weight benchmark pipeline with an SD-width UNet (gen_tiny_sd.py --bench)",
        "license": "MIT", "source": "testdata/models/gen_tiny_sd.py", "files": files,
        "options": {"steps": "25", "guidance_scale": "7.5"}})
    with open(os.path.join(d, "VERSION"), "w") as f:
        f.write(BENCH_VERSION + "\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--bench":
        v = os.path.join(sys.argv[2], "bench-sd", "VERSION")
        if not os.path.exists(v) or open(v).read().strip() != BENCH_VERSION:
            bench_pipeline(sys.argv[2])
        return
    if len(sys.argv) != 2:
        sys.exit("usage: gen_tiny_sd.py [--bench] MODELS_DIR")
    root = sys.argv[1]
    names = ["tiny-sd", "tiny-sd-inpaint", "tiny-sd-pix2pix", "tiny-sd-turbo"]
    if all(open(os.path.join(root, n, "VERSION")).read().strip() == VERSION
           for n in names if os.path.exists(os.path.join(root, n, "VERSION"))) and \
            all(os.path.exists(os.path.join(root, n, "VERSION")) for n in names):
        return
    i64, f32, f16 = TensorProto.INT64, TensorProto.FLOAT, TensorProto.FLOAT16
    pipeline(root, "tiny-sd", 4, np.float32, i64, "euler_a", {"steps": "3", "guidance_scale": "5"}, True)
    pipeline(root, "tiny-sd-inpaint", 9, np.float32, f32, "euler", {"steps": "2", "guidance_scale": "3"}, True,
             safety=False)
    pipeline(root, "tiny-sd-pix2pix", 8, np.float32, i64, "ddim",
             {"steps": "2", "guidance_scale": "3", "image_guidance_scale": "1.5"}, True, safety=False)
    pipeline(root, "tiny-sd-turbo", 4, np.float16, i64, "lcm", {"steps": "1", "guidance_scale": "0", "controlnet_divisors": "1,1"}, False,
             control=True, safety=False)


if __name__ == "__main__":
    main()
