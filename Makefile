# csisupd — see README.md. Every target works on a fresh clone.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN     := bin/csisupd
PROTOS  := $(wildcard api/csisupd/v1/*.proto)
CSI_PROTO_DIR = $(shell $(GO) list -m -f '{{.Dir}}' github.com/container-storage-interface/spec)

.PHONY: all build run test test-fault bench fuzz proto lint clean

all: build

## build: compile bin/csisupd
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/csisupd

## run: the dev agent with the built-in demo plugin (Ctrl-C stops it)
run: build
	./$(BIN) agent --dev

## test: vet plus the whole default test suite with the race detector
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

## test-fault: the long fault and soak tests (build tag "fault")
test-fault:
	$(GO) vet -tags fault ./...
	$(GO) test -race -count=1 -tags fault -timeout 30m ./...

## bench: benchmarks, each reported beside the direct path measured in the same run
## (node agent; ClientCSI vs direct plugin calls; Consul sync; cluster writes vs raw raft)
bench:
	@rm -f bench.out
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./test/bench/ | tee -a bench.out
	$(GO) test -run '^$$' -bench ClientCSIValidateVolume -benchtime 3s -count 1 ./internal/rpc/ | tee -a bench.out
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 ./internal/consulsync/ | tee -a bench.out
	$(GO) test -run '^$$' -bench PluginUpdates -benchtime 50000x -count 1 ./internal/server/ | tee -a bench.out

## fuzz: run every fuzz target of the repository for FUZZTIME each (default 20s); see scripts/fuzz.sh
FUZZTIME ?= 20s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

## proto: regenerate api/csisupd/v1 (needs protoc, protoc-gen-go, protoc-gen-go-grpc)
proto:
	protoc -I api -I /usr/include -I $(CSI_PROTO_DIR) \
		--go_out=. --go_opt=module=github.com/csisupd/csisupd \
		--go-grpc_out=. --go-grpc_opt=module=github.com/csisupd/csisupd \
		$(PROTOS)

## lint: formatting and vet
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin bench.out
