#!/usr/bin/env bash
# Fetches the UpscalerJS ESRGAN "thick" (RRDN, DIV2K) models by npm package
# name into the cache, checks every file used against
# scripts/assets-upscale.sha256, converts the x2 and x4 TF.js layers models
# to ONNX with scripts/tfjs_layers2onnx.py (checking the converted files'
# sha256 too) and installs one model folder with both scales as roles:
#   models/esrgan-thick  onnx/esrgan/thick  image-upscale  (roles x2, x4)
# Prints nothing on success. Re-running is cheap: verified files are kept.
# Needs npm, tar, sha256sum and /usr/bin/python3 with python3-onnx and
# python3-numpy; the ONNX Runtime library comes from scripts/assets.sh.
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
THICK_VERSION=1.0.0
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets-upscale.sha256"
dest="$CACHE/models/esrgan-thick"
mkdir -p "$CACHE/npm" "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

assets_tag=assets-upscale
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

unpacked=""
thick_models() { # unpack the x2 and x4 TF.js files once, checked, into $tmp/package/models
  [ -n "$unpacked" ] && return 0
  local tgz s f
  tgz=$(pack @upscalerjs/esrgan-thick "$THICK_VERSION" "upscalerjs-esrgan-thick-$THICK_VERSION.tgz")
  tar -xzf "$tgz" -C "$tmp" package/models/x2 package/models/x4 package/LICENSE
  for s in x2 x4; do
    for f in model.json group1-shard1of7.bin group1-shard2of7.bin group1-shard3of7.bin group1-shard4of7.bin \
      group1-shard5of7.bin group1-shard6of7.bin group1-shard7of7.bin; do
      check "$tmp/package/models/$s/$f" "esrgan-thick/$s/$f"
    done
  done
  check "$tmp/package/LICENSE" esrgan-thick/LICENSE
  unpacked=1
}

for s in x2 x4; do
  out="$dest/esrgan-thick-$s.onnx"
  if [ ! -f "$out" ] || ! ok "$out" "esrgan-thick-$s.onnx"; then
    thick_models
    /usr/bin/python3 "$here/tfjs_layers2onnx.py" "$tmp/package/models/$s/model.json" "$tmp/esrgan-thick-$s.onnx"
    check "$tmp/esrgan-thick-$s.onnx" "esrgan-thick-$s.onnx"
    mv "$tmp/esrgan-thick-$s.onnx" "$out"
  fi
done
if [ ! -f "$dest/LICENSE" ] || ! ok "$dest/LICENSE" esrgan-thick/LICENSE; then
  thick_models
  cp "$tmp/package/LICENSE" "$dest/LICENSE"
fi

cat >"$dest/manifest.json" <<JSON
{
  "id": "onnx/esrgan/thick",
  "name": "esrgan",
  "tag": "thick",
  "task": "image-upscale",
  "modalities": ["vision"],
  "description": "UpscalerJS ESRGAN thick (RRDN GAN trained on DIV2K), x2 and x4, converted from the TF.js layers models by scripts/tfjs_layers2onnx.py; NHWC RGB input and output in 0..1, run in overlapping feathered tiles",
  "license": "MIT (npm package @upscalerjs/esrgan-thick, LICENSE: Copyright (c) 2022 Kevin Scott)",
  "source": "npm package @upscalerjs/esrgan-thick@$THICK_VERSION (models/x2, models/x4)",
  "files": {"x2": "esrgan-thick-x2.onnx", "x4": "esrgan-thick-x4.onnx", "license": "LICENSE"},
  "options": {"layout": "nhwc", "input_range": "1", "tile": "128", "overlap": "16"}
}
JSON
