// Reference tokenizer for the parity tests of node/engine/tokenizer.
//
// Usage: node ref.js MODULES_DIR < request.json > response.json
//
// The request is {"file": "/path/tokenizer.json", "texts": [...],
// "decode": [[ids], ...]}. For each text the response gives the ids of
// encode(text) with special tokens, and for each id list decode(ids) with
// and without skipping special tokens; the id lists decoded are the Rust
// library's encodings of the texts followed by "decode". Two independent
// implementations answer:
//   rust: Hugging Face's tokenizers library (the Rust crate Python's
//         `tokenizers` wraps), through the N-API build @anush008/tokenizers
//   js:   Hugging Face's Tokenizers.js (@huggingface/tokenizers), the
//         tokenizers of Transformers.js
// MODULES_DIR is the node_modules folder scripts/assets-ref.sh installs.
"use strict";
const fs = require("fs");
const path = require("path");

async function main() {
  const modules = process.argv[2];
  if (!modules) throw new Error("usage: node ref.js MODULES_DIR");
  const req = JSON.parse(fs.readFileSync(0, "utf8"));
  const rustMod = require(path.join(modules, "@anush008/tokenizers"));
  const rust = rustMod.Tokenizer.fromFile(req.file);
  const out = { rust: { encode: [], decode: [], decode_skip: [] }, js: { encode: [], decode: [], decode_skip: [] } };
  for (const t of req.texts) {
    const enc = await rust.encode(t, null, { addSpecialTokens: true });
    out.rust.encode.push(enc.getIds());
  }
  const decode = out.rust.encode.concat(req.decode || []);
  for (const ids of decode) {
    out.rust.decode.push(await rust.decode(ids, false));
    out.rust.decode_skip.push(await rust.decode(ids, true));
  }
  const jsMod = await import(path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs"));
  const json = JSON.parse(fs.readFileSync(req.file, "utf8"));
  const js = new jsMod.Tokenizer(json, req.config || {});
  for (const t of req.texts) {
    try {
      out.js.encode.push(js.encode(t).ids);
    } catch (e) {
      out.js.encode.push(null);
    }
  }
  for (const ids of decode) {
    out.js.decode.push(js.decode(ids, { skip_special_tokens: false }));
    out.js.decode_skip.push(js.decode(ids, { skip_special_tokens: true }));
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack || e) + "\n");
  process.exit(1);
});
