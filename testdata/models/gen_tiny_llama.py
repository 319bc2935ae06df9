#!/usr/bin/python3
"""Generate tiny-llama, a small Llama/Qwen2-architecture chat model for tests.

Usage: /usr/bin/python3 testdata/models/gen_tiny_llama.py OUTPUT_DIR [--variant fp32|int8]

Writes into OUTPUT_DIR:
  model.onnx              a decoder-only transformer laid out as Optimum /
                          onnx-community export Llama and Qwen2 models:
                          inputs input_ids [batch, sequence_length],
                          attention_mask [batch, total_sequence_length],
                          position_ids [batch, sequence_length] (int64) and
                          past_key_values.N.key|value (float [batch, 2,
                          past_sequence_length, 16]); outputs logits (float
                          [batch, sequence_length, vocab]) and
                          present.N.key|value (float [batch, 2,
                          total_sequence_length, 16]). 2 layers, hidden 64,
                          4 query heads sharing 2 key/value heads (GQA),
                          RMSNorm, rotary position embeddings, q/k/v biases
                          (Qwen2), SwiGLU MLP (192), untied LM head, opset 17.
                          Weights are random from a fixed seed: the text it
                          writes is meaningless, the computation is real.
                          --variant int8 quantises every linear layer the way
                          ONNX Runtime's dynamic quantisation exports them
                          (int8 weights, DynamicQuantizeLinear + MatMulInteger).
  tokenizer.json          a Hugging Face byte-level BPE tokenizer in Qwen2's
                          layout (NFC, Split on Qwen2's look-ahead pattern,
                          ByteLevel, BPE with merges learnt here from the
                          English text below, deterministic) with added tokens
                          <|endoftext|>, <|im_start|>, <|im_end|> (special)
                          and <tool_call>, </tool_call> (not special).
  tokenizer_config.json   ChatML chat_template in Qwen2.5's form, tools
                          section and <tool_call> convention included.
  generation_config.json  eos ids (<|im_end|>, <|endoftext|>).
  manifest.json           the model store's manifest (onnx/tiny-llama/test,
                          or onnx/tiny-llama/test-int8 for the int8 variant).

Needs only onnx and numpy (Debian's python3-onnx and python3-numpy). The
output is byte-for-byte the same on every run.
"""

import collections
import json
import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20250117
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
FFN = 192
ROPE_THETA = 10000.0
RMS_EPS = 1e-6
NUM_MERGES = 1200
OPSET = 17

SPECIAL = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<tool_call>", False), ("</tool_call>", False)]

# Qwen2's pre-tokenizer pattern (needs look-ahead) and an ASCII rendering of
# it for training with Python's re module.
QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
TRAIN_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CORPUS = """
The mesh is a group of small computers that answer questions together. When a
request arrives, the node that receives it looks at its peers, picks the one
that holds the model and is least busy, and forwards the request there. The
answer streams back piece by piece, so the person who asked sees the first
words while the rest are still being written.

Every node keeps a table of its peers: their names, their addresses, how many
requests they are serving, which models they have loaded and how fast they
answered recently. The table travels between nodes by gossip, a little at a
time, so it is never exact but always close.

A chat model reads the whole conversation as one long text. Each message
starts with a marker that says who is speaking: the system, the user, the
assistant or a tool. The model writes the next message one token at a time,
and it stops when it writes the end marker or when it reaches the limit.

It was a cold morning in the mountains. The river ran fast under the old
stone bridge, and the village was still asleep. A farmer walked to the market
with a basket of apples, bread and cheese. The baker had already lit the oven,
and the smell of fresh bread filled the street. Children would soon run to
school, and the teacher would write the first lesson on the board.

What is the weather like today? It is sunny and warm in Paris, with a light
wind from the west. Tomorrow there will be rain in the north and clouds over
the sea. The temperature is 21 degrees in the afternoon and 12 at night.

{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "search", "arguments": {"query": "cheap flights to Rome", "limit": 5}}
{"answer": "yes", "confidence": 0.9, "tags": ["travel", "weather"], "ok": true}
{"title": "A short story", "pages": 12, "author": null, "draft": false}

Please answer in JSON. The reply must be a valid object with the fields that
the schema requires. Each field has a type: a string, a number, an integer, a
boolean, an array or another object. Strings are written between quotes, and
numbers are written without them.

I think that you should read the book before you watch the film. They said it
was the best story they had heard all year, and we agreed. She didn't know
where he'd gone, but she'll find out soon. We're ready when you're ready.

Count with me: one, two, three, four, five, six, seven, eight, nine, ten. The
year 2024 had 366 days; the next one has 365. Call 555 0100 for help.
"""


def bytes_to_unicode():
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))], [chr(c) for c in cs]


def train_bpe():
    """Learns NUM_MERGES merges on CORPUS; ties go to the smallest pair."""
    byte_chars, vocab_order = bytes_to_unicode()
    words = collections.Counter()
    for w in re.findall(TRAIN_PATTERN, CORPUS):
        words[tuple(byte_chars[b] for b in w.encode("utf-8"))] += 1
    words = dict(words)
    merges = []
    for _ in range(NUM_MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best_count = max(pairs.values())
        if best_count < 2:
            break
        best = min(p for p, n in pairs.items() if n == best_count)
        merges.append(best)
        merged = best[0] + best[1]
        new_words = {}
        for w, n in words.items():
            out = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + n
        words = new_words
    vocab = {c: i for i, c in enumerate(vocab_order)}
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    return vocab, merges


def tokenizer_json(vocab, merges):
    added = []
    for i, (content, special) in enumerate(SPECIAL):
        added.append({"id": len(vocab) + i, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": special})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }


# Qwen2.5-Instruct's chat template, with a neutral default system message.
CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def tokenizer_config(special_ids):
    decoder = {}
    for content, special in SPECIAL:
        decoder[str(special_ids[content])] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": special}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 2048,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }


def generation_config(special_ids):
    return {
        "bos_token_id": special_ids["<|endoftext|>"],
        "eos_token_id": [special_ids["<|im_end|>"], special_ids["<|endoftext|>"]],
        "pad_token_id": special_ids["<|endoftext|>"],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    }


class Graph:
    """Collects nodes and initializers with unique names."""

    def __init__(self, rng, quantize):
        self.rng = rng
        self.quantize = quantize
        self.nodes = []
        self.inits = []
        self.n = 0

    def name(self, hint):
        self.n += 1
        return "%s_%d" % (hint, self.n)

    def const(self, hint, array):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, hint, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def op(self, op_type, inputs, hint=None, outputs=None, **attrs):
        outs = outputs or [self.name(hint or op_type.lower())]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0] + "_node", **attrs))
        return outs[0] if len(outs) == 1 else outs

    def matmul(self, x, w, hint):
        """x @ w, as fp32 or with ONNX Runtime's dynamic int8 pattern."""
        if not self.quantize:
            return self.op("MatMul", [x, self.const(hint + "_w", w)], hint)
        scale = np.float32(max(np.abs(w).max(), 1e-8) / 127.0)
        wq = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        xq, xs, xz = [self.name(hint + s) for s in ("_xq", "_xs", "_xz")]
        self.op("DynamicQuantizeLinear", [x], outputs=[xq, xs, xz])
        acc = self.op("MatMulInteger", [xq, self.const(hint + "_wq", wq), xz, self.const(hint + "_wz", np.array(0, np.int8))], hint + "_int")
        accf = self.op("Cast", [acc], hint + "_f", to=TensorProto.FLOAT)
        s = self.op("Mul", [xs, self.const(hint + "_ws", np.array(scale, np.float32))], hint + "_scale")
        return self.op("Mul", [accf, s], hint)

    def linear(self, x, fan_in, fan_out, hint, bias=False):
        y = self.matmul(x, self.weight(hint, (fan_in, fan_out), 1.0 / np.sqrt(fan_in)), hint)
        if bias:
            y = self.op("Add", [y, self.const(hint + "_b", self.weight(hint + "_b", (fan_out,), 0.1))], hint + "_bias")
        return y

    def rms_norm(self, x, hint):
        sq = self.op("Mul", [x, x], hint + "_sq")
        ms = self.op("ReduceMean", [sq], hint + "_ms", axes=[-1], keepdims=1)
        eps = self.const(hint + "_eps", np.array(RMS_EPS, np.float32))
        inv = self.op("Reciprocal", [self.op("Sqrt", [self.op("Add", [ms, eps])])], hint + "_inv")
        gamma = self.const(hint + "_gamma", (1.0 + 0.1 * self.rng.standard_normal(HIDDEN)).astype(np.float32))
        return self.op("Mul", [self.op("Mul", [x, inv]), gamma], hint)


def build_model(vocab_rows, quantize):
    rng = np.random.default_rng(SEED)
    g = Graph(rng, quantize)
    i64 = lambda v: g.const("c", np.array(v, np.int64))

    x = g.op("Gather", [g.const("embed_tokens", g.weight("embed", (vocab_rows, HIDDEN), 1.0)), "input_ids"], "embed")

    # Rotary tables from position_ids: [batch, 1, seq, head_dim].
    inv_freq = (1.0 / (ROPE_THETA ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM))).astype(np.float32)
    pos = g.op("Unsqueeze", [g.op("Cast", ["position_ids"], "pos_f", to=TensorProto.FLOAT), i64([-1])], "pos_3d")
    freqs = g.op("Mul", [pos, g.const("inv_freq", inv_freq)], "freqs")
    emb = g.op("Concat", [freqs, freqs], "rope_emb", axis=-1)
    cos = g.op("Unsqueeze", [g.op("Cos", [emb]), i64([1])], "cos")
    sin = g.op("Unsqueeze", [g.op("Sin", [emb]), i64([1])], "sin")

    # Attention bias [batch, 1, seq, total]: causal over absolute positions
    # (past = total - seq) and padding from attention_mask.
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), i64(1)], "seq", axis=0)
    total = g.op("Gather", [g.op("Shape", ["attention_mask"]), i64(1)], "total", axis=0)
    past = g.op("Sub", [total, seq], "past")
    q_pos = g.op("Unsqueeze", [g.op("Range", [past, total, i64(1)]), i64([1])], "q_pos")
    k_pos = g.op("Unsqueeze", [g.op("Range", [i64(0), total, i64(1)]), i64([0])], "k_pos")
    causal = g.op("LessOrEqual", [k_pos, q_pos], "causal")
    keep = g.op("Unsqueeze", [g.op("Equal", ["attention_mask", i64(1)]), i64([1, 2])], "keep")
    allowed = g.op("And", [causal, keep], "allowed")
    bias = g.op("Where", [allowed, g.const("zero", np.array(0.0, np.float32)), g.const("neg", np.array(-1e9, np.float32))], "attn_bias")

    half = HEAD_DIM // 2
    rep = HEADS // KV_HEADS

    def rope(t, hint):
        x1 = g.op("Slice", [t, i64([0]), i64([half]), i64([3])], hint + "_x1")
        x2 = g.op("Slice", [t, i64([half]), i64([HEAD_DIM]), i64([3])], hint + "_x2")
        rot = g.op("Concat", [g.op("Neg", [x2]), x1], hint + "_rot", axis=3)
        return g.op("Add", [g.op("Mul", [t, cos]), g.op("Mul", [rot, sin])], hint + "_rope")

    def heads(t, n, hint):
        return g.op("Transpose", [g.op("Reshape", [t, i64([0, 0, n, HEAD_DIM])])], hint, perm=[0, 2, 1, 3])

    def repeat_kv(t, hint):
        if rep == 1:
            return t
        t = g.op("Expand", [g.op("Unsqueeze", [t, i64([2])]), i64([1, 1, rep, 1, 1])], hint + "_expand")
        return g.op("Reshape", [t, i64([0, HEADS, -1, HEAD_DIM])], hint + "_rep")

    scale = g.const("scale", np.array(1.0 / np.sqrt(HEAD_DIM), np.float32))
    for layer in range(LAYERS):
        p = "l%d" % layer
        h = g.rms_norm(x, p + "_input_norm")
        q = rope(heads(g.linear(h, HIDDEN, HEADS * HEAD_DIM, p + "_q", bias=True), HEADS, p + "_qh"), p + "_q")
        k = rope(heads(g.linear(h, HIDDEN, KV_HEADS * HEAD_DIM, p + "_k", bias=True), KV_HEADS, p + "_kh"), p + "_k")
        v = heads(g.linear(h, HIDDEN, KV_HEADS * HEAD_DIM, p + "_v", bias=True), KV_HEADS, p + "_vh")
        k_all = g.op("Concat", ["past_key_values.%d.key" % layer, k], outputs=["present.%d.key" % layer], axis=2)
        v_all = g.op("Concat", ["past_key_values.%d.value" % layer, v], outputs=["present.%d.value" % layer], axis=2)
        kt = g.op("Transpose", [repeat_kv(k_all, p + "_k")], p + "_kt", perm=[0, 1, 3, 2])
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, kt]), scale]), bias], p + "_scores")
        probs = g.op("Softmax", [scores], p + "_probs", axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, repeat_kv(v_all, p + "_v")])], p + "_ctx", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, i64([0, 0, HEADS * HEAD_DIM])], p + "_merge")
        x = g.op("Add", [x, g.linear(ctx, HEADS * HEAD_DIM, HIDDEN, p + "_o")], p + "_attn_res")

        h = g.rms_norm(x, p + "_post_norm")
        gate = g.linear(h, HIDDEN, FFN, p + "_gate")
        up = g.linear(h, HIDDEN, FFN, p + "_up")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up], p + "_swiglu")
        x = g.op("Add", [x, g.linear(act, FFN, HIDDEN, p + "_down")], p + "_mlp_res")

    x = g.rms_norm(x, "final_norm")
    # Logit scale ~3: peaked but not degenerate distributions.
    g.op("Identity", [g.matmul(x, g.weight("lm_head", (HIDDEN, vocab_rows), 3.0 / np.sqrt(HIDDEN)), "lm_head")], outputs=["logits"])

    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", f, ["batch_size", "sequence_length", vocab_rows])]
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info("past_key_values.%d.%s" % (layer, kind), f, ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]))
            outputs.append(helper.make_tensor_value_info("present.%d.%s" % (layer, kind), f, ["batch_size", KV_HEADS, "total_sequence_length", HEAD_DIM]))
    graph = helper.make_graph(g.nodes, "tiny_llama", inputs, outputs, g.inits)
    model = helper.make_model(graph, producer_name="infermesh gen_tiny_llama.py", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def manifest(variant):
    suffix = "" if variant == "fp32" else "-" + variant
    return {
        "id": "onnx/tiny-llama/test" + suffix,
        "name": "tiny-llama",
        "tag": "test" + suffix,
        "task": "chat",
        "modalities": ["chat"],
        "license": "MIT",
        "source": "generated by testdata/models/gen_tiny_llama.py",
        "description": "Test-only %d-layer Llama/Qwen2-architecture decoder (hidden %d, %d heads, %d key/value heads, %s) with random weights from a fixed seed and a byte-level BPE tokenizer trained on a few paragraphs; its text is meaningless." % (LAYERS, HIDDEN, HEADS, KV_HEADS, variant),
        "files": {"model": "model.onnx", "tokenizer": "tokenizer.json", "tokenizer_config": "tokenizer_config.json", "generation_config": "generation_config.json"},
        "options": {"context_window": "2048", "max_output": "1024"},
    }


def write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def dump(obj):
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def main():
    args = sys.argv[1:]
    variant = "fp32"
    if len(args) == 3 and args[1] == "--variant" and args[2] in ("fp32", "int8"):
        variant = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.stderr.write("usage: gen_tiny_llama.py OUTPUT_DIR [--variant fp32|int8]\n")
        return 2
    out = args[0]
    os.makedirs(out, exist_ok=True)
    vocab, merges = train_bpe()
    special_ids = {content: len(vocab) + i for i, (content, _) in enumerate(SPECIAL)}
    size = len(vocab) + len(SPECIAL)
    rows = (size + 63) // 64 * 64  # padded like real checkpoints; rows past the tokenizer are never valid ids
    write(os.path.join(out, "tokenizer.json"), dump(tokenizer_json(vocab, merges)))
    write(os.path.join(out, "tokenizer_config.json"), dump(tokenizer_config(special_ids)))
    write(os.path.join(out, "generation_config.json"), dump(generation_config(special_ids)))
    write(os.path.join(out, "model.onnx"), build_model(rows, variant == "int8").SerializeToString())
    # The manifest goes last: its presence means the other files are complete.
    write(os.path.join(out, "manifest.json"), dump(manifest(variant)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
