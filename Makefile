# Images of the two components.
IMG_OPERATOR ?= ghcr.io/tsingress/operator:dev
IMG_PROXY ?= ghcr.io/tsingress/proxy:dev
# Kustomize overlay that deploy and build-installer render (config/default, or an overlay under config/overlays).
OVERLAY ?= config/default

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/tsingress/tsingress/internal/version.Version=$(VERSION)

CONTAINER_TOOL ?= docker
KUBECTL ?= kubectl
KIND_CLUSTER ?= tsingress-e2e

SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

# Variables that help shows by their values.
HELP_VARS = OVERLAY KIND_CLUSTER CHAOS_CLUSTER FUZZTIME

.PHONY: help
help: ## Show this help.
	@awk -v vars='$(foreach v,$(HELP_VARS),$(v)=$($(v)))' 'BEGIN {FS = ":.*##"; n = split(vars, kv, " "); for (i = 1; i <= n; i++) { eq = index(kv[i], "="); val[substr(kv[i], 1, eq - 1)] = substr(kv[i], eq + 1) }; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { d = $$2; while (match(d, /\$$\([A-Z_]+\)/)) d = substr(d, 1, RSTART - 1) val[substr(d, RSTART + 2, RLENGTH - 3)] substr(d, RSTART + RLENGTH); printf "  \033[36m%-18s\033[0m %s\n", $$1, d } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate CRDs and RBAC from kubebuilder markers.
	$(CONTROLLER_GEN) rbac:roleName=tsingress-manager crd paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: test
test: manifests generate vet envtest headscale ## Run every test: unit, envtest and integration (real apiserver, tailnet, Headscale, kernel).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" HEADSCALE_BIN="$(HEADSCALE)" KUBEBUILDER_CONTROLPLANE_START_TIMEOUT=120s \
		go test ./... -coverprofile cover.out -timeout 20m

# Flags for the benchmark, e.g. BENCH_ARGS='-n 100,1000 -baseline /path/to/an/older/operator'.
BENCH_ARGS ?=

.PHONY: bench
bench: envtest ## Measure the data path side by side with tailscale's Serve, the control plane at N = 100/1,000/5,000 and the operator's memory; writes docs/performance.md.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go run ./tools/bench $(BENCH_ARGS)

.PHONY: lint
lint: golangci-lint ## Run golangci-lint with .golangci.yml over every package, tests and the e2e and chaos suites included.
	$(GOLANGCI_LINT) run ./...

.PHONY: verify
verify: manifests generate ## Fail when generated files are out of date, a tracked file is a built binary or over 1 MiB (hack/check-tree.sh), or make lint finds anything.
	@failed=(); \
	git diff --exit-code -- api config || { echo "generated files are stale: run make manifests generate"; failed+=(generated); }; \
	hack/check-tree.sh || failed+=(tree); \
	$(MAKE) --no-print-directory lint || failed+=(lint); \
	[ $${#failed[@]} -eq 0 ] || { echo "verify failed: $${failed[*]}"; exit 1; }

##@ Build

.PHONY: build
build: ## Build the operator and proxy binaries into bin/.
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o bin/operator ./cmd/operator
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o bin/proxy ./cmd/proxy

.PHONY: dev
dev: manifests envtest ## Run everything locally: control plane, local tailnet with ACME CA, operator, proxies, and the samples proved (L3 needs root, nftables, iproute2).
	go build -o $(LOCALBIN)/devenv ./tools/devenv
	@# Run by make itself (no go run between), so that make's signals reach it and make waits for its cleanup.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(LOCALBIN)/devenv $(DEV_ARGS)

.PHONY: run
run: manifests generate ## Run the operator against the cluster of your kubeconfig.
	go run ./cmd/operator --operator-namespace=tailscale

.PHONY: docker-build
docker-build: ## Build both images from the Dockerfiles (base images and Go modules supplied locally when no registry answers).
	hack/docker-build.sh $(IMG_OPERATOR) $(IMG_PROXY) $(VERSION)

.PHONY: docker-push
docker-push: ## Push both images.
	$(CONTAINER_TOOL) push $(IMG_OPERATOR)
	$(CONTAINER_TOOL) push $(IMG_PROXY)

.PHONY: build-installer
build-installer: manifests kustomize ## Render $(OVERLAY) with the current images into dist/install.yaml.
	mkdir -p dist
	hack/render.sh $(KUSTOMIZE) $(OVERLAY) $(IMG_OPERATOR) $(IMG_PROXY) > dist/install.yaml

##@ Deployment

.PHONY: install
install: manifests kustomize ## Install the CRDs into the cluster (deploy installs the IngressClass too).
	$(KUSTOMIZE) build config/crd | $(KUBECTL) apply --server-side -f -

.PHONY: uninstall
uninstall: manifests kustomize ## Remove the CRDs from the cluster.
	$(KUSTOMIZE) build config/crd | $(KUBECTL) delete --ignore-not-found -f -

.PHONY: deploy
deploy: manifests kustomize ## Deploy $(OVERLAY) into the cluster.
	hack/render.sh $(KUSTOMIZE) $(OVERLAY) $(IMG_OPERATOR) $(IMG_PROXY) | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: kustomize ## Remove $(OVERLAY) from the cluster.
	hack/render.sh $(KUSTOMIZE) $(OVERLAY) $(IMG_OPERATOR) $(IMG_PROXY) | $(KUBECTL) delete --ignore-not-found -f -

# Flags for the e2e suite's test binary.
E2E_ARGS ?= -ginkgo.v

.PHONY: kind
kind: ## Create or reuse kind cluster $(KIND_CLUSTER); offline, the node image is built from Debian packages and Go sources (cached).
	hack/kind-up.sh $(KIND_CLUSTER)

.PHONY: test-e2e
test-e2e: manifests kustomize ## Run the e2e suite on kind cluster $(KIND_CLUSTER) with real Pods from images built here, on the local tailnet (or yours, with TS_API_CLIENT_ID/TS_API_CLIENT_SECRET).
	KIND_CLUSTER=$(KIND_CLUSTER) IMG_OPERATOR=$(IMG_OPERATOR) IMG_PROXY=$(IMG_PROXY) VERSION=$(VERSION) \
		KUSTOMIZE=$(KUSTOMIZE) E2E_ARGS='$(E2E_ARGS)' hack/e2e-kind.sh

.PHONY: kind-delete
kind-delete: ## Delete kind cluster $(KIND_CLUSTER).
	bin/kind delete cluster --name $(KIND_CLUSTER)

# Kind cluster of the chaos suite: its own, so that it runs beside the e2e suite's.
CHAOS_CLUSTER ?= tsingress-chaos
# Flags for the chaos suite's test binary.
CHAOS_ARGS ?= -ginkgo.v
# Its images, under tags of their own: Docker's images are shared with the e2e suite's builds.
CHAOS_IMG_OPERATOR ?= $(IMG_OPERATOR:%:dev=%:chaos)
CHAOS_IMG_PROXY ?= $(IMG_PROXY:%:dev=%:chaos)

.PHONY: chaos
chaos: manifests kustomize envtest ## Run the reliability suites (envtest, then faults on kind cluster $(CHAOS_CLUSTER)) and write docs/reliability.md.
	KIND_CLUSTER=$(CHAOS_CLUSTER) IMG_OPERATOR=$(CHAOS_IMG_OPERATOR) IMG_PROXY=$(CHAOS_IMG_PROXY) VERSION=$(VERSION) \
		KUSTOMIZE=$(KUSTOMIZE) ENVTEST_ASSETS="$(ENVTEST_ASSETS)" CHAOS_ARGS='$(CHAOS_ARGS)' hack/chaos-kind.sh

# How long make fuzz runs each fuzz target.
FUZZTIME ?= 5m

.PHONY: fuzz
fuzz: ## Run every fuzz target for $(FUZZTIME) each (failing inputs land in testdata/fuzz; the figures in bin/fuzz-summary.txt).
	FUZZTIME=$(FUZZTIME) FUZZ_SUMMARY=$(LOCALBIN)/fuzz-summary.txt hack/fuzz.sh

.PHONY: test-e2e-local
test-e2e-local: manifests envtest ## Start an environment of its own as make dev does, prove the samples, run the e2e suite in it, stop it (L3 specs need root).
	go test -c -tags e2e -o $(LOCALBIN)/e2e.test ./test/e2e/
	go build -o $(LOCALBIN)/devenv ./tools/devenv
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(LOCALBIN)/devenv -logs $(LOCALBIN)/e2e-local-logs -- $(LOCALBIN)/e2e.test -test.v -test.timeout 15m $(E2E_ARGS)

##@ Tools

LOCALBIN ?= $(CURDIR)/bin
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
KUSTOMIZE ?= $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
ENVTEST_ASSETS ?= $(LOCALBIN)/envtest

CONTROLLER_TOOLS_VERSION ?= v0.23.0
KUSTOMIZE_VERSION ?= v5.8.2
GOLANGCI_LINT_VERSION ?= v2.15.0

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Install controller-gen into bin/.
$(CONTROLLER_GEN): | $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Install kustomize into bin/.
$(KUSTOMIZE): | $(LOCALBIN)
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Build golangci-lint from source into bin/ (several minutes the first time).
$(GOLANGCI_LINT): | $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

.PHONY: envtest
envtest: ## Build kube-apiserver, kube-controller-manager and etcd from source into bin/envtest when missing.
	hack/build-envtest.sh $(ENVTEST_ASSETS)

# go-install-tool installs package $2 at version $3 as binary $1.
define go-install-tool
@[ -f "$(1)" ] || { \
set -e; \
echo "installing $(2)@$(3)"; \
rm -f $(1) || true; \
GOBIN=$(LOCALBIN) go install $(2)@$(3); \
mv $(LOCALBIN)/$$(basename $(2) | sed 's/^v[0-9]*$$/kustomize/') $(1); \
}
endef

HEADSCALE ?= $(LOCALBIN)/headscale

.PHONY: headscale
headscale: ## Build Headscale from source into bin/ when missing (test/headscale reads it from HEADSCALE_BIN).
	hack/build-headscale.sh $(HEADSCALE)
