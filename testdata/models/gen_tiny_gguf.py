#!/usr/bin/python3
"""Generate tiny-gguf, a small random-weight llama-architecture GGUF chat model.

Usage: /usr/bin/python3 testdata/models/gen_tiny_gguf.py OUTPUT_DIR [--shape tiny|smollm2-135m]

Writes into OUTPUT_DIR:
  model.gguf     GGUF v3, architecture "llama", all tensors F32 (file type
                 ALL_F32), with the metadata llama.cpp reads: llama.* hyper-
                 parameters (context, embedding, blocks, feed-forward, heads,
                 KV heads, rope base, RMS epsilon) and the tokenizer:
                 tokenizer.ggml.model "gpt2" (byte-level BPE),
                 tokenizer.ggml.pre "qwen2", tokens, token types (normal,
                 control for <|endoftext|> <|im_start|> <|im_end|>,
                 user-defined for <tool_call> </tool_call>), merges, EOS /
                 BOS / padding ids, and tokenizer.chat_template (Qwen2.5's
                 ChatML template with its tools section). The BPE merges and
                 the template are tiny-llama's (gen_tiny_llama.py).
                 --shape tiny (default): 2 layers, hidden 64, 4 heads over 2
                 KV heads, feed-forward 192, the tokenizer's 1,005 tokens.
                 --shape smollm2-135m: SmolLM2-135M's shape (hidden 576, 30
                 layers, 9 heads, 3 KV heads, feed-forward 1536, vocabulary
                 49152: the tokenizer's tokens padded with unused ones), for
                 benchmarks (538 MB).
  manifest.json  the model store's manifest (gguf/tiny-gguf/test, or
                 gguf/smollm2-shape/bench-f32).

Weights are random from a fixed seed: the text is meaningless, the
computation is real. Needs numpy (and python3-onnx, which gen_tiny_llama.py
imports); the output is byte-for-byte the same on every run.
"""

import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_tiny_llama as tl  # noqa: E402  (tokenizer and template)

SEED = 20251129
SHAPES = {
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=192, vocab=0, ctx=2048),
    "smollm2-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, ffn=1536, vocab=49152, ctx=8192),
}
ALIGN = 32

# GGUF value types.
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
# Token types.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == T_U32:
        out += struct.pack("<I", value)
    elif vtype == T_I32:
        out += struct.pack("<i", value)
    elif vtype == T_F32:
        out += struct.pack("<f", value)
    elif vtype == T_BOOL:
        out += struct.pack("<B", 1 if value else 0)
    elif vtype == T_STR:
        out += gstr(value)
    else:
        raise ValueError(vtype)
    return out


def kv_array(key, etype, values):
    out = gstr(key) + struct.pack("<IIQ", T_ARR, etype, len(values))
    if etype == T_STR:
        out += b"".join(gstr(v) for v in values)
    elif etype == T_I32:
        out += struct.pack("<%di" % len(values), *values)
    else:
        raise ValueError(etype)
    return out


def vocabulary(pad_to):
    """The tiny-llama BPE vocabulary in id order, token types, merges."""
    vocab, merges = tl.train_bpe()
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    types = [NORMAL] * len(tokens)
    special = {}
    for content, is_special in tl.SPECIAL:
        special[content] = len(tokens)
        tokens.append(content)
        types.append(CONTROL if is_special else USER_DEFINED)
    i = 0
    while len(tokens) < pad_to:
        tokens.append("<unused_%d>" % i)
        types.append(UNUSED)
        i += 1
    return tokens, types, [a + " " + b for a, b in merges], special


def tensors(shape, n_vocab):
    rng = np.random.default_rng(SEED)
    h, ff = shape["hidden"], shape["ffn"]
    hd = h // shape["heads"]
    kvd = hd * shape["kv_heads"]

    def w(out_dim, in_dim):
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)

    out = [("token_embd.weight", rng.standard_normal((n_vocab, h)).astype(np.float32))]
    for i in range(shape["layers"]):
        p = "blk.%d." % i
        out += [
            (p + "attn_norm.weight", norm()),
            (p + "attn_q.weight", w(h, h)),
            (p + "attn_k.weight", w(kvd, h)),
            (p + "attn_v.weight", w(kvd, h)),
            (p + "attn_output.weight", w(h, h)),
            (p + "ffn_norm.weight", norm()),
            (p + "ffn_gate.weight", w(ff, h)),
            (p + "ffn_up.weight", w(ff, h)),
            (p + "ffn_down.weight", w(h, ff)),
        ]
    out += [("output_norm.weight", norm()), ("output.weight", w(n_vocab, h))]
    return out


def write_gguf(path, shape, name):
    tokens, types, merges, special = vocabulary(shape["vocab"])
    n_vocab = len(tokens)
    h = shape["hidden"]
    meta = [
        kv("general.architecture", T_STR, "llama"),
        kv("general.name", T_STR, name),
        kv("general.file_type", T_U32, 0),
        kv("general.alignment", T_U32, ALIGN),
        kv("llama.context_length", T_U32, shape["ctx"]),
        kv("llama.embedding_length", T_U32, h),
        kv("llama.block_count", T_U32, shape["layers"]),
        kv("llama.feed_forward_length", T_U32, shape["ffn"]),
        kv("llama.attention.head_count", T_U32, shape["heads"]),
        kv("llama.attention.head_count_kv", T_U32, shape["kv_heads"]),
        kv("llama.rope.freq_base", T_F32, 10000.0),
        kv("llama.rope.dimension_count", T_U32, h // shape["heads"]),
        kv("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        kv("llama.vocab_size", T_U32, n_vocab),
        kv("tokenizer.ggml.model", T_STR, "gpt2"),
        kv("tokenizer.ggml.pre", T_STR, "qwen2"),
        kv_array("tokenizer.ggml.tokens", T_STR, tokens),
        kv_array("tokenizer.ggml.token_type", T_I32, types),
        kv_array("tokenizer.ggml.merges", T_STR, merges),
        kv("tokenizer.ggml.eos_token_id", T_U32, special["<|im_end|>"]),
        kv("tokenizer.ggml.bos_token_id", T_U32, special["<|endoftext|>"]),
        kv("tokenizer.ggml.padding_token_id", T_U32, special["<|endoftext|>"]),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, False),
        kv("tokenizer.chat_template", T_STR, tl.CHAT_TEMPLATE),
    ]
    ts = tensors(shape, n_vocab)
    infos = []
    offset = 0
    for tname, arr in ts:
        dims = list(reversed(arr.shape))  # ne0 first
        infos.append(gstr(tname) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", 0, offset))
        offset += arr.nbytes
        offset = (offset + ALIGN - 1) // ALIGN * ALIGN
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(ts), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        f.write(b"\0" * ((-f.tell()) % ALIGN))
        for _, arr in ts:
            f.write(arr.tobytes())
            f.write(b"\0" * ((-arr.nbytes) % ALIGN))
    os.replace(tmp, path)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    out = args[0]
    shape = "tiny"
    if "--shape" in args:
        shape = args[args.index("--shape") + 1]
    if shape not in SHAPES:
        sys.exit("unknown shape %r" % shape)
    os.makedirs(out, exist_ok=True)
    if shape == "tiny":
        mid, name, desc = "gguf/tiny-gguf/test", "tiny-gguf", "a tiny random-weight llama-architecture GGUF chat model for tests (2 layers, hidden 64, ChatML)"
    else:
        mid, name, desc = "gguf/smollm2-shape/bench-f32", "smollm2-shape", "a random-weight GGUF in SmolLM2-135M's shape for benchmarks"
    write_gguf(os.path.join(out, "model.gguf"), SHAPES[shape], name)
    manifest = {
        "id": mid,
        "name": name,
        "tag": mid.split("/")[-1],
        "task": "chat",
        "modalities": ["text"],
        "description": desc + "; generated by testdata/models/gen_tiny_gguf.py, weights random (meaningless text)",
        "license": "MIT",
        "source": "testdata/models/gen_tiny_gguf.py",
        "files": {"model": "model.gguf"},
        "options": {"context_window": "2048", "max_output": "512", "prefix_cache_tokens": "16384", "prefix_cache_seqs": "16"},
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
