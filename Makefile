# SPDX-License-Identifier: Apache-2.0
# Thin wrapper over meson: dependencies, build, demo, tests, benchmarks. The build is meson's.
#
#   make demo        install deps, build, run a te-bench sweep on loopback (bytes verified)
#   make test        install deps, build, run the CI suites; last line `N passed, N failed`
#   make bench       run the baseline comparison scripts bench/*.sh
#   make bench-core  core overhead: te-bench --core slices/s + callgrind instructions/slice
#   make clean       remove the build directories
#
# Variables: BUILD (default build), MESON_SETUP_ARGS (used when BUILD is first configured),
# SUITES (default: unit integration system fuzz), BENCH_ARGS (te-bench arguments of demo).

BUILD ?= build
MESON ?= meson
NINJA ?= ninja
# Development and CI builds treat warnings as errors (plain `meson setup` does not).
MESON_SETUP_ARGS ?= -Dwerror=true
SUITES ?= unit integration system fuzz
BENCH_ARGS ?= --loopback --sweep --op both --verify --duration 0.5

SHELL := /bin/bash

# Transport plugins built in this tree (not the fake test plugins), for tools run by hand.
BUILT_PLUGIN_PATH = $$(find $(BUILD)/plugins -name '*.so' \
	-printf '%h\n' 2>/dev/null | sort -u | paste -sd:)

.PHONY: all deps install-deps deps-build deps-test deps-bench setup build demo test bench bench-full \
	bench-core clean

all: build

deps install-deps:
	@scripts/install-deps.sh

# Each target installs only the package groups it needs.
deps-build:
	@scripts/install-deps.sh build
deps-test:
	@scripts/install-deps.sh build test
deps-bench:
	@scripts/install-deps.sh build bench

# Configure once; afterwards ninja reconfigures by itself when meson files change.
$(BUILD)/build.ninja:
	$(MESON) setup $(BUILD) $(MESON_SETUP_ARGS)

setup: $(BUILD)/build.ninja

build: setup
	$(NINJA) -C $(BUILD)

demo: deps-build
	@$(MAKE) --no-print-directory build
	@export TE_PLUGIN_PATH="$${TE_PLUGIN_PATH:-$(BUILT_PLUGIN_PATH)}"; \
	echo "== te-bench $(BENCH_ARGS)  (embedded default: p2p metadata, tcp on loopback)"; \
	$(BUILD)/tools/te-bench $(BENCH_ARGS)

# A build failure is one failed test, so the last line is always the count.
test: deps-test
	@$(MAKE) --no-print-directory build || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
	@scripts/run-tests.sh -C $(BUILD) $(SUITES)

# bench: every bench/*.sh, the long ones cut down (compare-tcp --quick, a 2-minute soak,
# mesh of 16 for 10 s; about 15 minutes in all). bench-full: each at its defaults (hours:
# compare-tcp's full matrix alone takes several).
BENCH_QUICK = compare-tcp.sh:--quick --rounds 3|compare-builds.sh:--rounds 3|soak.sh:--minutes 2|mesh.sh:--engines 16 --duration 10
bench bench-full: deps-bench
	@$(MAKE) --no-print-directory build
	@shopt -s nullglob; n=0; rc=0; \
	for s in bench/*.sh; do \
		n=$$((n + 1)); a=""; \
		if [ "$@" = bench ]; then \
			a=$$(printf '%s\n' "$(BENCH_QUICK)" | tr '|' '\n' | \
			     sed -n "s|^$${s#bench/}:||p"); \
		fi; \
		echo "== $$s $$a"; \
		BUILD=$(BUILD) bash "$$s" $$a || rc=1; \
	done; \
	[ $$n -gt 0 ] || echo "no bench/*.sh scripts yet"; \
	exit $$rc

bench-core: deps-bench
	@$(MAKE) --no-print-directory build
	@scripts/bench-core.sh -C $(BUILD)

clean:
	rm -rf build build-* $(BUILD)
