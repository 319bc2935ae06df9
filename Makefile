# infermesh: `make run` starts a node on its defaults, `make test` runs the tests.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/infermesh
BIN   := bin/infermesh
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GOFLAGS_LD := -ldflags "-X main.version=$(VERSION)"
DATA ?= data
export PATH := $(CACHE)/bin:$(PATH)

.PHONY: all build run test test-short bench lint assets deps proto fuzz e2e clean chaos chaos-short

all: build

build:
	go build $(GOFLAGS_LD) -o $(BIN) ./cmd/infermesh

deps:
	scripts/deps.sh

# Fetch the ONNX Runtime library and ISNet by npm package name, generate the
# small test models, all into $(CACHE).
assets: deps
	scripts/assets.sh
	scripts/assets-vision.sh
	scripts/assets-audio.sh
	/usr/bin/python3 testdata/models/gen_tiny_bert.py $(CACHE)/models/tiny-bert
	/usr/bin/python3 testdata/models/gen_tiny_llama.py $(CACHE)/models/tiny-llama

# Start a node on the embedded defaults (127.0.0.1:11436) with the fetched
# models installed into ./data.
run: build assets
	@for m in isnet tiny-bert tiny-llama; do \
	  [ -n "$$(ls -d $(DATA)/models/*$$m* 2>/dev/null)" ] || $(BIN) models import --data-dir $(DATA) $(CACHE)/models/$$m; \
	done
	$(BIN) serve --data-dir $(DATA)

test: assets
	go vet ./...
	go test -count=1 -timeout 20m ./...
	$(MAKE) fuzz

# Short fuzz runs of the request decoders and codecs.
fuzz:
	go test -run '^$$' -fuzz '^FuzzParseEmbeddings$$' -fuzztime 10s ./node/api
	go test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 10s ./node/imagecodec
	go test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime 10s ./node/engine/tokenizer
	go test -run '^$$' -fuzz '^FuzzEncodeBPE$$' -fuzztime 10s ./node/engine/tokenizer
	go test -run '^$$' -fuzz '^FuzzSchemaAutomaton$$' -fuzztime 10s ./node/engine/chat
	go test -run '^$$' -fuzz '^FuzzParseChat$$' -fuzztime 10s ./node/api
	go test -run '^$$' -fuzz '^FuzzParseImages$$' -fuzztime 10s ./node/api

bench: assets
	go test -run '^$$' -bench . -count 1 -timeout 30m ./...

# Every full-length chaos scenario (5 real nodes each, about 12 min) in a
# private network namespace; partition scenarios need root + iptables and
# are listed as skipped otherwise. Report, summary and timeline.png go to
# chaos/out/<time>/.
chaos: build assets
	go run ./chaos/cmd/chaos -scenarios all -bin $(BIN)

# The short versions of scenarios 1 and 4 (about 1 min).
chaos-short: build assets
	INFERMESH_CHAOS_BIN=$(CURDIR)/$(BIN) go test -count=1 -run TestChaosShort -v ./chaos

lint:
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }

proto:
	@command -v buf >/dev/null || GOBIN=$(CACHE)/bin go install github.com/bufbuild/buf/cmd/buf@v1.75.0
	@command -v protoc-gen-go >/dev/null || GOBIN=$(CACHE)/bin go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	@command -v protoc-gen-connect-go >/dev/null || GOBIN=$(CACHE)/bin go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
	buf generate

clean:
	rm -rf bin
