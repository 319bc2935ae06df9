#!/usr/bin/env bash
# Fetches llama.cpp's prebuilt shared libraries for linux x64 by npm package
# name (@node-llama-cpp/linux-x64, which ships libllama, libggml, libggml-base
# and one libggml-cpu-<variant> per x64 CPU generation, chosen at run time)
# into $CACHE/llama/<version>/, checks the tarball and every library against
# scripts/assets.sha256 (the Makefile's assets target then writes the GGUF
# test model with testdata/models/gen_tiny_gguf.py). Prints nothing on success; re-running is cheap (verified files are kept).
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
LLAMA_NPM_VERSION=3.21.1
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets.sha256"
dest="$CACHE/llama/$LLAMA_NPM_VERSION"
mkdir -p "$CACHE/npm" "$dest"

assets_tag=assets-llama
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

libs=(libllama.v0.4.0.so libggml.v0.4.0.so libggml-base.so
  libggml-cpu-x64.so libggml-cpu-sse42.so libggml-cpu-sandybridge.so libggml-cpu-ivybridge.so
  libggml-cpu-piledriver.so libggml-cpu-haswell.so libggml-cpu-skylakex.so libggml-cpu-cannonlake.so
  libggml-cpu-cascadelake.so libggml-cpu-icelake.so libggml-cpu-cooperlake.so libggml-cpu-zen4.so
  libggml-cpu-alderlake.so libggml-cpu-sapphirerapids.so)

missing=0
for l in "${libs[@]}"; do
  if [ ! -f "$dest/$l" ] || ! ok "$dest/$l" "llama/$l"; then missing=1; fi
done
if [ "$missing" = 1 ]; then
  tgz=$(pack @node-llama-cpp/linux-x64 "$LLAMA_NPM_VERSION" "node-llama-cpp-linux-x64-$LLAMA_NPM_VERSION.tgz")
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$tgz" -C "$tmp" package/bins/linux-x64 package/LICENSE
  for l in "${libs[@]}"; do
    check "$tmp/package/bins/linux-x64/$l" "llama/$l"
    mv "$tmp/package/bins/linux-x64/$l" "$dest/$l"
  done
  cp "$tmp/package/LICENSE" "$dest/LICENSE"
fi
