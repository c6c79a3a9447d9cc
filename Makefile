# The two front-door commands (README quickstart): `make run` and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
# A node with a working NVIDIA driver runs on it; anywhere else the simulated 8-GPU node.
BACKEND ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo auto || echo sim)
# On the simulator, a kernel log of its own (append NVRM lines to it) rather than this machine's /dev/kmsg.
KMSG    := $(if $(filter sim,$(BACKEND)),--kmsg.path .state/kmsg.log)
# This machine only: on the simulator anyone who reaches the port can inject faults. `make run LISTEN=:9481`
# serves every interface, as the packaged unit does.
LISTEN  ?= 127.0.0.1:9481
ARGS    ?=

.PHONY: run test lint bench clean vgpu

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

run: $(VENV)/.installed
	mkdir -p .state && touch .state/kmsg.log
	@echo "gpu-triage: starting on $(LISTEN) (Ctrl-C stops it). In another terminal, for the gpu-triage command:"
	@echo "    cd $(CURDIR) && . $(VENV)/bin/activate        (or install it: pipx install $(CURDIR))"
	$(VENV)/bin/gpu-triage serve --backend $(BACKEND) --web.listen-address $(LISTEN) --state.dir .state $(KMSG) $(ARGS)

test: $(VENV)/.installed lint
	$(VENV)/bin/pytest $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict tools/gen_kubernetes.py tools/gen_vgpu_layout.py
	$(PY) tools/gen_kubernetes.py --check
	$(PY) tools/gen_vgpu_layout.py --check

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The virtual GPU: a libnvidia-ml.so.1 that the real pynvml loads (vgpu/README.md).
VGPU_LIB    := build/vgpu/libnvidia-ml.so.1
VGPU_CFLAGS := -std=c11 -O2 -g -fPIC -fvisibility=hidden -pthread -Wall -Wextra -Werror -Wpedantic -Wshadow

vgpu: $(VGPU_LIB)

# Built under a temporary name and renamed, so a process loading the library never maps a half-written file.
$(VGPU_LIB): $(wildcard vgpu/*.c) $(wildcard vgpu/*.h)
	mkdir -p $(dir $@)
	$(CC) $(VGPU_CFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -o $@.tmp.$$$$ $(wildcard vgpu/*.c) && mv -f $@.tmp.$$$$ $@

clean:
	rm -rf $(VENV) .state build *.egg-info
