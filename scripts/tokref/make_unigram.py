#!/usr/bin/python3
"""Generates node/engine/tokenizer/testdata/unigram_xlmr.json.

No real XLM-R or T5 tokenizer.json is obtainable by package name here, so
this trains a small SentencePiece Unigram model (Debian python3-sentencepiece,
normalization rule nmt_nfkc, the rule XLM-R and T5 were trained with) on a
generated multilingual corpus and writes it in the exact layout of XLM-R's
tokenizer.json: Precompiled normalizer (the model's real compiled charsmap)
followed by Replace(" {2,}" -> " "), Metaspace pre-tokenizer (prepend
always, split), Unigram model with unk_id, TemplateProcessing <s> A </s>,
Metaspace decoder. Deterministic: same output on every run.

Usage: /usr/bin/python3 scripts/tokref/make_unigram.py OUT.json
"""
import base64
import json
import os
import random
import sys
import tempfile

import sentencepiece as spm


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def corpus(rnd):
    words = ("the quick brown fox jumps over lazy dog hello world tokenizer "
             "unigram model language piece score café naïve résumé über straße "
             "déjà vu español mañana français ça garçon 日本語 東京 中文 你好 世界 "
             "한국어 안녕 Привет мир привет Ελληνικά γειά 123 4567 2024 code def "
             "return print(x) {a: 1} [1, 2] ﬁ ① ＡＢＣ １２３ ｶﾀｶﾅ").split()
    lines = []
    for _ in range(4000):
        lines.append(" ".join(rnd.choice(words) for _ in range(rnd.randint(3, 12))))
    return lines


def main():
    out = sys.argv[1]
    rnd = random.Random(19)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "corpus.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus(rnd)) + "\n")
        prefix = os.path.join(tmp, "m")
        spm.SentencePieceTrainer.train(
            input=text, model_prefix=prefix, model_type="unigram", vocab_size=180,
            normalization_rule_name="nmt_nfkc", character_coverage=0.98,
            num_threads=1, seed_sentencepiece_size=20000, minloglevel=2,
            unk_id=3, bos_id=0, pad_id=1, eos_id=2, byte_fallback=False)
        proto = open(prefix + ".model", "rb").read()
    pieces, charsmap = [], None
    for num, _, v in fields(proto):
        if num == 1:  # SentencePiece {piece=1, score=2, type=3}
            p = {"score": 0.0, "type": 1}
            for n2, _, v2 in fields(v):
                if n2 == 1:
                    p["piece"] = v2.decode("utf-8")
                elif n2 == 2:
                    import struct
                    p["score"] = struct.unpack("<f", v2)[0]
                elif n2 == 3:
                    p["type"] = v2
            pieces.append(p)
        elif num == 3:  # NormalizerSpec {precompiled_charsmap=2}
            for n2, _, v2 in fields(v):
                if n2 == 2:
                    charsmap = v2
    assert charsmap, "no precompiled charsmap in the model"
    vocab = [[p["piece"], 0.0 if p["type"] != 1 else round(p["score"], 6)] for p in pieces]
    special = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for name, i in special.items():
        assert vocab[i][0] == name, (i, vocab[i])
    vocab.append(["<mask>", 0.0])
    added = [{"id": i, "content": c, "single_word": False, "lstrip": c == "<mask>", "rstrip": False,
              "normalized": False, "special": True}
             for c, i in list(special.items()) + [("<mask>", len(vocab) - 1)]]
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": meta,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "</s>", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                                              "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": meta,
        "model": {"type": "Unigram", "unk_id": 3, "vocab": vocab, "byte_fallback": False},
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
