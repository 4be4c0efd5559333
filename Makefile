# csisupd — see README.md. Every target works on a fresh clone.
GO      ?= go
# The build's stamp (cmd/csisupd/version.go): the release tag, without its
# "v" (none on an untagged commit: the binary then says 0.0.0-dev+COMMIT),
# the commit, whether tracked files differ from it, and the commit's time as
# SOURCE_DATE_EPOCH (reproducible-builds.org), so that the stamp of one
# commit is the same whenever and wherever it is built. Outside a git
# checkout they are empty and the binary falls back to what the go command
# recorded.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' 2>/dev/null | sed 's/^v//')
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
DIRTY   ?= $(shell git rev-parse --git-dir >/dev/null 2>&1 && { test -z "$$(git status --porcelain --untracked-files=no)" && echo false || echo true; })
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
export SOURCE_DATE_EPOCH
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.dirty=$(DIRTY) -X main.buildEpoch=$(SOURCE_DATE_EPOCH)
BIN     := bin/csisupd
PROTOS  := $(wildcard api/csisupd/v1/*.proto)
# The servers' storage format (raft log, snapshots, state rows); no services.
STATE_PROTOS := $(wildcard internal/server/statepb/*.proto)
# Every directory of generated code that proto-check compares.
PROTO_GO_DIRS := api/csisupd/v1 internal/server/statepb
CSI_PROTO_DIR = $(shell $(GO) list -m -f '{{.Dir}}' github.com/container-storage-interface/spec)

# Pinned tool versions: CI installs exactly these, so lint and generated code
# do not depend on what a machine happens to have. protoc is Debian's
# protobuf-compiler package; its version is written into every generated file.
STATICCHECK_VERSION        := v0.8.2
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
PROTOC_VERSION             := 3.21.12
TOOLS                      := $(CURDIR)/bin/tools

.PHONY: all build release reproducible package test-package run test race-tests test-fault fault-tests test-binaries test-binaries-race nemesis nemesis-defects nemesis-short bench bench-table bench-compare fuzz tools proto proto-check docs docs-check lint clean

all: build

## build: compile bin/csisupd
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/csisupd

## release: the release binary $(DIST)/csisupd, reproducible: static (CGO_ENABLED=0), without
## the builder's paths (-trimpath), with no build id and the stamp above (SOURCE_DATE_EPOCH is the
## commit's time, not the clock's): two builds of one commit, anywhere, are the same bytes.
## -buildvcs=false: the stamp says all that the go command's VCS record would, and that record
## also counts untracked files.
DIST            := dist
RELEASE_LDFLAGS := -s -w -buildid= $(LDFLAGS)
release:
	@mkdir -p $(DIST)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "$(RELEASE_LDFLAGS)" -o $(DIST)/csisupd ./cmd/csisupd

## reproducible: build HEAD's release binary in two clones at different paths and fail unless
## they are the same bytes and hold neither path (scripts/reproducible.sh; FRESH_CACHE=1 compiles
## the second in an empty build cache, which takes minutes)
reproducible:
	GO=$(GO) FRESH_CACHE=$(FRESH_CACHE) ./scripts/reproducible.sh

## package: the release packages, into $(DIST): a .deb and an .rpm of the release binary (nfpm,
## scripts/package), the agent's OCI image as an OCI layout ($(DIST)/oci) and a docker save
## tarball (go-containerregistry, no container daemon; CA certificates from CA_FILE), a CycloneDX
## SBOM of the binary's Go modules, and SHA256SUMS; two runs for one commit write the same bytes
CA_FILE ?= /etc/ssl/certs/ca-certificates.crt
package: release
	$(GO) run ./scripts/package -bin $(DIST)/csisupd -deploy deploy -man docs/man -out $(DIST) -ca-file $(CA_FILE)

## test-package: make package twice (the same SHA256SUMS), then the .deb installed with dpkg, its
## unit verified, the installed agent started and stopped, removed and purged; the .rpm read back
## with rpm and the .deb checked by lintian where installed; the image read back (build tag
## "package"; needs root and dpkg, else it skips, saying why)
test-package:
	$(GO) test -tags package -count=1 -timeout 20m -v ./test/package/

## run: the dev agent with the built-in demo plugin (Ctrl-C stops it)
run: build
	./$(BIN) agent --dev

## test: vet plus the whole default test suite with the race detector
test:
	$(GO) vet ./...
	$(MAKE) race-tests

## race-tests: the whole default test suite with the race detector, without vet (CI's lint vets)
race-tests:
	$(GO) test -race -count=1 ./...

## FAULT_PKGS and FAULT_TESTS are what the fault tag adds to the default suite: the tests of the
## files built only with it, and the tests whose settings it changes (test/layering checks the
## lists against the sources, both ways). The rest of those packages is the default suite's.
FAULT_PKGS := ./internal/server/ ./internal/server/fsm/ ./test/agent/ ./test/e2e/ ./test/soak/
FAULT_TESTS := TestFormationRepeated|TestLinearizableVolumesUnderLeaderKills|TestTwoThousandAgentsHeartbeat|\
	TestVolumeModelRejectsLostWrite|TestVolumeWorkRightAfterFailover|TestExpansionFinishesAfterLeaderKill|\
	TestSnapshotNeverOrphanedAfterLeaderKill|TestClaimCommandsKeepThePromise|TestPropertyCatchesAMissingSingleWriterCheck|\
	TestHungRegistrationSocketsCostLittle|TestAgentKilledBetweenStageAndPublish|TestAgentKilledBetweenUnpublishAndUnstage|\
	TestNodeDownLongerThanClaimGCGrace|TestForcedReleaseOfAKilledNode|TestSecretsFileAcrossSIGHUP|TestClusterLeaderLoss|\
	TestLostMountRecord|TestWatchdogGapsStayFarBelowTimeout|TestOutageRecoveryByTheREADME|TestLeaderKilledMidClaim|\
	TestLeaderStoppedMidClaim|TestVolumeHealthOfRealAgents|TestAgentRefusesAFIFOSecretsFile|TestSecretsFileFIFOAcrossSIGHUP|\
	TestHostilePluginsDoNotStallSupervision|TestLeasedClaimSurvivesLeaderKill|TestEphemeralDeletedAfterLeaderKill|TestLeaseHeldByAnAgent|\
	TestPodmanAgentKilledWhileContainerRuns|TestDockerReconcileWithTheEngine
# FAULT_TESTS as one -run pattern: the continued lines' spaces removed.
empty :=
FAULT_RUN = ^($(subst $(empty) ,,$(strip $(FAULT_TESTS))))$$

## test-fault: the long fault and soak tests (build tag "fault"; only FAULT_TESTS, the default suite
## is make test's), then the nemesis soak's short run (it skips, saying why, without root and the
## tools it needs)
test-fault:
	$(GO) vet -tags fault ./...
	$(MAKE) fault-tests
	$(MAKE) nemesis-short

## fault-tests: only the tests of FAULT_TESTS, with the fault tag and the race detector; the
## packages of FAULT_ALONE after the others, one at a time: their soaks hold the agent to CPU and
## probe-lateness budgets, which another package's tests beside them can break
FAULT_ALONE := ./test/soak/
fault-tests:
	$(GO) test -race -count=1 -tags fault -timeout 30m -run '$(FAULT_RUN)' $(filter-out $(FAULT_ALONE),$(FAULT_PKGS))
	$(GO) test -race -count=1 -tags fault -timeout 30m -p 1 -run '$(FAULT_RUN)' $(FAULT_ALONE)

## nemesis: the soak: servers and agents as processes on simulated hosts (network namespaces)
## under randomised overlapping faults, checked from the test plugins' call journals and the
## clients' claim history (build tag "nemesis"; needs root, ip, iptables and unshare, else it
## skips). SEED=N is the first seed (default: from the clock, logged), SEEDS=K how many seeds
## (default 1, a fresh cluster each), NEMESIS_TIME=D how long each runs (default 3m).
## Replay a failing run with the SEED and NEMESIS_TIME it printed.
## FAULTS=kind,kind limits the faults drawn (the kinds are in docs/development.md, "How we test").
## SERVERS=N and AGENTS=M fix the cluster's size (default: drawn from each seed).
NEMESIS_FLAGS = $(if $(SEED),-seed=$(SEED)) -nemesis-seeds=$(or $(SEEDS),1) -nemesis-time=$(or $(NEMESIS_TIME),3m) \
	$(if $(FAULTS),-nemesis-faults=$(FAULTS)) $(if $(SERVERS),-nemesis-servers=$(SERVERS)) $(if $(AGENTS),-nemesis-agents=$(AGENTS))
nemesis:
	$(GO) test -race -tags nemesis -count=1 -timeout 0 -v -run 'TestNemesis$$' ./test/nemesis/ -args $(NEMESIS_FLAGS)

## DEFECT_TAGS are the deliberate defects of TestDefects; lint vets each build.
DEFECT_TAGS = nemesis_defect_single_writer nemesis_defect_forget_record nemesis_defect_skip_unpublish \
	nemesis_defect_ack_release nemesis_defect_panic nemesis_defect_leak nemesis_defect_busy_release \
	nemesis_defect_lease_never_expires

## nemesis-defects: build csisupd with each deliberate defect (nemesis_defect_* tags) and show
## that the soak's check meant for it catches it; then the cluster's fault controls themselves
## Each defect's soak is on a lab of its own, DEFECT_PARALLEL at a time (they mostly wait on the
## cluster), after TestClusterComesUp; each ends as soon as its check has caught its defect.
DEFECT_PARALLEL ?= 4
nemesis-defects:
	$(GO) test -tags nemesis -count=1 -timeout 60m -parallel $$(( $(DEFECT_PARALLEL) + 1 )) -run 'TestDefects|TestClusterComesUp' \
		./test/nemesis/ -args -nemesis-parallel=$(DEFECT_PARALLEL)

## nemesis-short: the CI run of the soak: two fixed seeds of 45 s each, side by side, each on a
## cluster and lab of its own
nemesis-short:
	$(GO) test -race -tags nemesis -count=1 -timeout 15m -parallel 2 -run 'TestNemesis$$' ./test/nemesis/ \
		-args -seed=1 -nemesis-seeds=2 -nemesis-time=45s -nemesis-servers=3 -nemesis-agents=3 -nemesis-parallel=2

## test-binaries, test-binaries-race: every binary the tests start as a process, built once into
## TEST_BINDIR (the race detector's build of csisupd apart); with CSISUPD_TEST_BINDIR naming it,
## each test package uses these instead of building its own (testutil.Build; the names are
## testutil.PrebuiltName's). CI builds them first. Each is built in a staging directory and
## renamed into place: a test that starts meanwhile finds a whole binary or none (and builds its own).
TEST_BINDIR ?= $(CURDIR)/bin/test
TEST_CMDS   := ./internal/testplugin/cmd/csi-testplugin ./internal/testregistrar/cmd/csi-testregistrar ./test/soak/cmd/csi-hostile
test-binaries:
	@rm -rf $(TEST_BINDIR)/.staging && mkdir -p $(TEST_BINDIR)/.staging
	$(GO) build -o $(TEST_BINDIR)/.staging/csisupd ./cmd/csisupd
	$(GO) build -o $(TEST_BINDIR)/.staging/ $(TEST_CMDS)
	for tag in $(DEFECT_TAGS); do $(GO) build -tags $$tag -o $(TEST_BINDIR)/.staging/csisupd-$$tag ./cmd/csisupd || exit 1; done
	mv $(TEST_BINDIR)/.staging/* $(TEST_BINDIR)/ && rmdir $(TEST_BINDIR)/.staging
test-binaries-race:
	@mkdir -p $(TEST_BINDIR)/.staging-race
	$(GO) build -race -o $(TEST_BINDIR)/.staging-race/csisupd-race ./cmd/csisupd
	mv $(TEST_BINDIR)/.staging-race/csisupd-race $(TEST_BINDIR)/ && rmdir $(TEST_BINDIR)/.staging-race

## bench: benchmarks, each reported beside the direct path measured in the same run, into bench.out
## (node agent; a 10,000-node cluster; lease renewals of 10,000 claims on 1,000 nodes beside
## heartbeats alone; ClientCSI vs direct plugin calls; event latency beside
## stalled subscribers; Consul sync; cluster writes vs raw raft; the leader's CPU and allocations per
## heartbeat at 10,000 nodes; claims and releases, what they
## write, and their rate at 1 and 10 controller calls in flight vs serial; stored rows to answers
## vs encoding; a kubelet-registered plugin and a required one's plugin-missing vs a socket in the
## plugin directory). The list is scripts/bench.sh's BENCHES; BENCH=regexp runs only its lines
## that match.
bench:
	GO=$(GO) BENCH='$(BENCH)' ./scripts/bench.sh run bench.out

## bench-table: write the performance table of docs/performance.md from BENCH_OUT (default
## bench.out; several make bench outputs, one file each or one after the other in one, give each
## figure as the range of the runs); CAPTION="..." says where and when they ran
BENCH_OUT ?= bench.out
bench-table:
	$(GO) run ./scripts/benchtable table -doc docs/performance.md -caption '$(CAPTION)' $(BENCH_OUT)

## bench-compare: BASE=<commit>: the benchmarks of BASE and of the working tree, paired in one run
## (each line of BENCHES on both sides in turn, COUNT=N times, default 1), then each figure of
## both and their ratio, marking those worse by more than NOISE percent (default 10; STRICT=1 fails
## then). Outputs: bench-base.out, bench-new.out. BENCH=regexp and DRY_RUN=1 as for scripts/bench.sh.
bench-compare:
	GO=$(GO) BASE='$(BASE)' COUNT='$(COUNT)' NOISE='$(NOISE)' STRICT='$(STRICT)' BENCH='$(BENCH)' DRY_RUN='$(DRY_RUN)' \
		./scripts/bench.sh compare

## fuzz: run every fuzz target of the repository for FUZZTIME each (default 20s); see scripts/fuzz.sh
FUZZTIME ?= 20s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

## tools: install the pinned staticcheck, protoc-gen-go and protoc-gen-go-grpc into bin/tools
tools:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

## proto: regenerate api/csisupd/v1 and internal/server/statepb with protoc $(PROTOC_VERSION) and the pinned generators
proto: tools
	@v=$$(protoc --version 2>/dev/null); if [ "$$v" != "libprotoc $(PROTOC_VERSION)" ]; then \
		echo "make proto: need protoc $(PROTOC_VERSION) (Debian's protobuf-compiler), found '$${v:-none}'"; exit 1; fi
	PATH="$(TOOLS):$$PATH" protoc -I api -I /usr/include -I $(CSI_PROTO_DIR) \
		--go_out=. --go_opt=module=github.com/csisupd/csisupd \
		--go-grpc_out=. --go-grpc_opt=module=github.com/csisupd/csisupd \
		$(PROTOS)
	PATH="$(TOOLS):$$PATH" protoc -I . -I /usr/include \
		--go_out=. --go_opt=module=github.com/csisupd/csisupd \
		$(STATE_PROTOS)

## proto-check: fail when the generated code in $(PROTO_GO_DIRS) is not what make proto writes from the .proto files
proto-check:
	@before=$$(mktemp -d); trap 'rm -rf "$$before"' EXIT; \
	for d in $(PROTO_GO_DIRS); do mkdir -p "$$before/$$d" && cp $$d/*.pb.go "$$before/$$d"/; done; \
	$(MAKE) --no-print-directory proto >/dev/null || exit 1; \
	stale=; for d in $(PROTO_GO_DIRS); do for f in $$d/*.pb.go; do cmp -s "$$f" "$$before/$$f" || stale="$$stale $$f"; done; done; \
	if [ -n "$$stale" ]; then \
		echo "generated code is not what make proto writes from the .proto files:$$stale"; \
		echo "(make proto has rewritten them: review and commit)"; exit 1; fi

## docs: regenerate the man pages of docs/man and docs/cli.md from the command tree (cobra/doc,
## with a fixed date, so that the same commands give the same bytes)
docs:
	$(GO) test -count=1 -run '^TestGeneratedDocs$$' ./cmd/csisupd/ -args -update-docs

## docs-check: fail when docs/man or docs/cli.md is not what make docs writes from the command tree
docs-check:
	@out=$$($(GO) test -count=1 -run '^TestGeneratedDocs$$' ./cmd/csisupd/ 2>&1) || { \
		echo "$$out" | grep -e 'make docs' -e FAIL; exit 1; }

## lint: gofmt, go vet and staticcheck (default and fault tags), go mod tidy, generated code and docs up to date
lint: tools
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags fault ./...
	$(GO) vet -tags nemesis ./...
	$(GO) vet -tags package ./test/package/
	for tag in $(DEFECT_TAGS); do $(GO) vet -tags $$tag ./... || exit 1; done
	$(GO) mod tidy -diff
	$(TOOLS)/staticcheck ./...
	$(TOOLS)/staticcheck -tags fault ./...
	$(TOOLS)/staticcheck -tags nemesis ./...
	$(TOOLS)/staticcheck -tags package ./test/package/
	$(MAKE) proto-check
	$(MAKE) docs-check

clean:
	rm -rf bin $(DIST) bench.out bench-base.out bench-new.out
