// Reference tokenizer of the Universal Sentence Encoder lite, for the
// parity test of node/engine/tokenizer (PieceTokenizer).
//
// Usage: node use.js INDEX_JS VOCAB_JSON < texts.json > ids.json
//
// INDEX_JS is dist/index.js of @energetic-ai/embeddings, the TF.js
// wrapper that feeds the model (scripts/assets-use.sh installs it as
// tokref/energetic-ai-embeddings/index.js); VOCAB_JSON is the model's
// vocab.json. The wrapper's only dependency, its TF.js core, is not needed
// to tokenize and is replaced by an empty module. The input is a JSON array
// of strings; the output, one id array per string.
"use strict";
const fs = require("fs");

const [indexJS, vocabJSON] = process.argv.slice(2);
if (!indexJS || !vocabJSON) throw new Error("usage: node use.js INDEX_JS VOCAB_JSON");
const mod = { exports: {} };
const load = new Function("module", "exports", "require", fs.readFileSync(indexJS, "utf8"));
load(mod, mod.exports, (name) => (name === "@energetic-ai/core" ? {} : require(name)));
const vocabulary = JSON.parse(fs.readFileSync(vocabJSON, "utf8"));
const tok = new mod.exports.EmbeddingsModel({ vocabulary, model: null }).tokenizer;
const texts = JSON.parse(fs.readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(texts.map((t) => tok.encode(t))));
