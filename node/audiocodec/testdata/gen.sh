#!/bin/sh
# Regenerates the committed test files (Debian ffmpeg with libmp3lame and
# libvorbis). Each is a 440 Hz tone on the left channel and a 1 kHz tone on
# the right, at ffmpeg's default sine amplitude 1/8 halved (1/16), stereo.
#   sh node/audiocodec/testdata/gen.sh
set -e
cd "$(dirname "$0")"
tone() { # tone RATE SECONDS
  echo "-f lavfi -i sine=frequency=440:sample_rate=$1:duration=$2 -f lavfi -i sine=frequency=1000:sample_rate=$1:duration=$2 -filter_complex [0][1]amerge=inputs=2,volume=0.5 -ac 2"
}
ff() { ffmpeg -hide_banner -loglevel error -y -bitexact "$@"; }
ff $(tone 44100 1) -c:a libmp3lame -b:a 32k tone.mp3
ff $(tone 22050 0.5) -c:a flac -sample_fmt s16 tone.flac
ff $(tone 44100 1) -c:a libvorbis -q:a 0 tone.ogg
ff -f lavfi -i sine=frequency=440:sample_rate=48000:duration=0.2 -c:a libopus -b:a 16k tone.opus
