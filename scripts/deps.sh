#!/usr/bin/env bash
# Installs the Debian packages the build and tests need when they are missing:
# python3-onnx and python3-numpy (the test-model generators), iproute2 and
# iptables (chaos), libjpeg62-turbo-dev (linked statically into the binary by
# node/imagecodec's JPEG decoder; build with -tags nolibjpeg to do without).
# Needs root for apt-get; without it, says what to install.
set -euo pipefail
need=()
/usr/bin/python3 -c 'import onnx, numpy' 2>/dev/null || need+=(python3-onnx python3-numpy)
command -v npm >/dev/null || need+=(npm)
command -v iptables >/dev/null || need+=(iptables)
command -v ip >/dev/null || need+=(iproute2)
[ -f /usr/include/jpeglib.h ] || need+=(libjpeg62-turbo-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "deps: please install: ${need[*]} (apt-get install ${need[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
