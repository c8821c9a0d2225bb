"""The Helm chart (charts/metis) against the kustomize manifests it mirrors, with no cluster:
its copies of the CRD and of the monitoring and Argo CD files are byte-equal to their
sources; `helm lint --strict` passes; the default values render, object by object, what
`kubectl kustomize manifests/` renders, and each switched value what the kustomization it
stands for renders; and every values set conforms to the real schemas (kubeconform -strict).

Helm and kubeconform are built from their Go modules (tools/helm, tools/kubeconform; cached like
promtool). kubeconform gets its schemas offline, from Go modules rather than its usual download:
the built-in kinds from the OpenAPI document of k8s.io/kubernetes at the control plane's
version (metis_dev/go/kube-bin pins it), PodMonitor and PrometheusRule from the Prometheus
Operator's CRDs, KnowledgeBase from crds/knowledgebase.yaml. tests/kube/test_helm.py installs
the chart on a control plane."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_dev.build import ensure_binaries
from tests.support import go_tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "metis"
MANIFESTS = ROOT / "manifests"
KUBE_MODULE = ROOT / "metis_dev" / "go" / "kube-bin"
"""The wrapper module that pins k8s.io/kubernetes: its api/openapi-spec/swagger.json holds the
built-in kinds' schemas at the version the local control plane runs."""
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
"""Its example/prometheus-operator-crd/ holds the PodMonitor and PrometheusRule CRDs."""

COPIES = {
    "crds/knowledgebase.yaml": "crds/knowledgebase.yaml",
    "files/rules.yaml": "manifests/monitoring/component/rules.yaml",
    "files/dashboard.json": "manifests/monitoring/component/dashboard.json",
    "files/health.lua": "manifests/argocd/health.lua",
}
"""The chart's files (Helm reads nothing outside the chart) and the sources they copy."""

VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "everything": [
        "--set=console.enabled=true",
        "--set=monitoring.enabled=true",
        "--set=monitoring.labels.release=kube-prometheus-stack",
        "--set=argocd.healthCheck=true",
        "--set=imagePullSecrets[0].name=registry",
        "--set-string=operator.extraEnv.METIS_LOG_FORMAT=json",
        "--set=operator.nodeSelector.pool=system",
        "--set=operator.tolerations[0].key=dedicated",
        "--set=operator.tolerations[0].operator=Exists",
        "--set=networkPolicy.indexerPeers.namespaces[0]=monitoring",
        "--set=networkPolicy.indexerPeers.cidrs[0]=10.0.0.0/24",
        "--set=monitoring.runbookBaseURL=https://docs.team.example/metis/",
        "--set=namespace.create=true",
        "--set=test.base=handbook",
        "--set=test.namespace=team-a",
        "--set=test.question=How many holidays?",
        "--set=test.port=7701",
    ],
    "single-namespace": ["--set=singleNamespace=true", "--set=console.enabled=true"],
    "nothing-optional": [
        "--set=networkPolicy.enabled=false",
        "--set=operator.podDisruptionBudget.enabled=false",
        "--set=operator.replicas=1",
    ],
}
"""Every value the chart offers switched away from its default in at least one set."""


# --------------------------------------------------------------------------- tools


@pytest.fixture(scope="module")
def helm() -> Path:
    return go_tools.built("helm")


@pytest.fixture(scope="module")
def kubeconform() -> Path:
    return go_tools.built("kubeconform")


def run(argv: list[str | Path], **kw: Any) -> str:
    out = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, **kw
    )
    assert out.returncode == 0, f"{argv}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def template(
    helm: Path, *values: str, namespace: str = "metis-system", crds: bool = True
) -> list[dict[str, Any]]:
    """`helm template` of the chart as release `metis` in `namespace`."""
    argv: list[str | Path] = [helm, "template", "metis", CHART, "--namespace", namespace]
    return documents(run([*argv, *(["--include-crds"] if crds else []), *values]))


def kustomize(*folders: Path) -> list[dict[str, Any]]:
    """What kubectl's kustomize renders of each folder, together."""
    kubectl = ensure_binaries() / "kubectl"
    return [d for f in folders for d in documents(run([kubectl, "kustomize", f]))]


def keyed(objects: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The objects by (kind, namespace, name); no two alike."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for o in objects:
        meta = o["metadata"]
        key = (o["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in found, f"{key} twice"
        found[key] = o
    return found


def assert_same_objects(chart: list[dict[str, Any]], kustomized: list[dict[str, Any]]) -> None:
    """The same objects, each equal in content (key order and comments aside)."""
    ours, theirs = keyed(chart), keyed(kustomized)
    assert sorted(ours) == sorted(theirs)
    for key in sorted(ours):
        assert ours[key] == theirs[key], key


# --------------------------------------------------------------------------- copies, lint


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_the_charts_copies_equal_their_sources(copy: str) -> None:
    """A `make crd`, a new alert or a new panel that forgets the chart fails here: copy the
    source over the chart's file (cp <source> charts/metis/<copy>)."""
    assert (CHART / copy).read_bytes() == (ROOT / COPIES[copy]).read_bytes(), (
        f"charts/metis/{copy} differs from {COPIES[copy]}: cp {COPIES[copy]} charts/metis/{copy}"
    )


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_helm_lint_strict(helm: Path, values: str) -> None:
    out = run([helm, "lint", "--strict", CHART, "--namespace", "metis-system", *VALUE_SETS[values]])
    assert "0 chart(s) failed" in out, out


def test_a_misspelt_value_is_refused_by_name(helm: Path) -> None:
    """values.schema.json knows every value: a typo fails the install and names the key,
    instead of leaving the default in place unsaid."""
    out = subprocess.run(
        [str(helm), "template", "metis", str(CHART), "--set=operator.replica=3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0
    assert "'/operator': additional properties 'replica' not allowed" in out.stderr, out.stderr


def test_the_notes_say_what_was_installed_and_what_next(helm: Path) -> None:
    """NOTES.txt, as `helm install` prints it: the namespace, the indexer image, the next
    commands, and the console's port-forward when the console is on."""
    argv: list[str | Path] = [helm, "install", "metis", CHART, "--namespace", "team-a"]
    out = run([*argv, "--dry-run=client", "--set=console.enabled=true"])
    notes = out[out.index("NOTES:") :]
    assert "installed in namespace team-a." in notes
    assert "every base's indexer runs ghcr.io/astraeus/metis-indexer:0.1.0" in notes
    assert "kubectl -n team-a rollout status deployment/metis-operator" in notes
    assert "kubectl -n team-a port-forward svc/metis-console 8080" in notes
    assert "Monitoring" not in notes


def test_monitoring_objects_carry_the_labels_a_prometheus_selects_on(helm: Path) -> None:
    """monitoring.labels (kube-prometheus-stack selects on `release`) on every PodMonitor and
    the PrometheusRule, beside their own labels."""
    values = ["--set=monitoring.enabled=true", "--set=monitoring.labels.release=kps"]
    objects = [o for o in template(helm, *values) if o["kind"] in {"PodMonitor", "PrometheusRule"}]
    assert len(objects) == 3
    for o in objects:
        labels = o["metadata"]["labels"]
        assert labels["release"] == "kps" and labels["app.kubernetes.io/part-of"] == "metis", o


# --------------------------------------------------------------------------- kustomize


def test_default_values_render_what_kustomize_renders(helm: Path) -> None:
    """`helm install` installs what `kubectl apply -k manifests/` does: the CRD, the
    cluster-wide RBAC and the operator, and with namespace.create the namespace; no Helm
    labels on them."""
    chart = template(helm, "--set=namespace.create=true")
    assert_same_objects(chart, kustomize(MANIFESTS))
    assert {o["kind"] for o in chart} >= {"CustomResourceDefinition", "Namespace", "Deployment"}


def test_the_namespace_is_the_teams_unless_asked(helm: Path) -> None:
    """By default the release renders no Namespace: installed into one that exists, and left
    by `helm uninstall` (Helm deletes what a release rendered)."""
    assert "Namespace" not in {o["kind"] for o in template(helm)}


def test_indexer_pull_secrets_peers_and_runbooks_reach_the_operator(helm: Path) -> None:
    chart = template(helm, *VALUE_SETS["everything"])
    (operator,) = [o for o in chart if o["kind"] == "Deployment" and o["metadata"]["name"]
                   == "metis-operator"]  # fmt: skip
    env = {e["name"]: e.get("value") for e in
           operator["spec"]["template"]["spec"]["containers"][0]["env"]}  # fmt: skip
    assert env["METIS_INDEXER_IMAGE_PULL_SECRETS"] == "registry"
    assert env["METIS_NETWORK_ALLOW_NAMESPACES"] == "monitoring"
    assert env["METIS_NETWORK_ALLOW_CIDRS"] == "10.0.0.0/24"
    (rule,) = [o for o in chart if o["kind"] == "PrometheusRule"]
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith("https://docs.team.example/metis/runbooks/#") for u in urls)
    defaults = template(helm, "--set=monitoring.enabled=true")
    (rule,) = [o for o in defaults if o["kind"] == "PrometheusRule"]
    first = rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"]
    assert first.startswith("https://astraeus.github.io/metis/runbooks/#")


@pytest.mark.parametrize(
    ("value", "folder"),
    [("console.enabled", "console"), ("monitoring.enabled", "monitoring")],
)
def test_a_switched_value_adds_what_its_kustomization_adds(
    helm: Path, value: str, folder: str
) -> None:
    """console.enabled and monitoring.enabled stand for `kubectl apply -k manifests/console/`
    and `-k manifests/monitoring/` after manifests/."""
    chart = template(helm, f"--set={value}=true", "--set=namespace.create=true")
    assert_same_objects(chart, kustomize(MANIFESTS, MANIFESTS / folder))


def test_single_namespace_renders_the_namespaced_overlay(helm: Path) -> None:
    """singleNamespace in team-a is manifests/overlays/namespaced/ (whose namespace is team-a):
    nothing cluster-scoped, not even the CRD when installed with --skip-crds."""
    chart = template(helm, "--set=singleNamespace=true", namespace="team-a", crds=False)
    assert_same_objects(chart, kustomize(MANIFESTS / "overlays" / "namespaced"))
    assert all(o["metadata"].get("namespace") == "team-a" for o in chart)


def test_the_argocd_health_check_is_argocds_snippet(helm: Path) -> None:
    """argocd.healthCheck renders the data of manifests/argocd/argocd-cm.yaml, to merge into
    argocd-cm; the chart never renders argocd-cm itself (Argo CD owns it)."""
    objects = keyed(template(helm, "--set=argocd.healthCheck=true"))
    snippet = yaml.safe_load((MANIFESTS / "argocd" / "argocd-cm.yaml").read_text())
    assert objects["ConfigMap", "metis-system", "metis-argocd-health"]["data"] == snippet["data"]
    assert not [k for k in objects if k[2] == "argocd-cm"]


def test_values_reach_the_operator(helm: Path) -> None:
    """Image, pull policy, resources, replicas and extra settings land where the kustomize
    user would patch them."""
    objects = keyed(
        template(
            helm,
            "--set=image.repository=registry.example/metis-operator",
            "--set=image.tag=0.2.0",
            "--set=image.pullPolicy=IfNotPresent",
            "--set=indexerImage.tag=0.2.0",
            "--set=operator.resources.limits.memory=1Gi",
            "--set=operator.replicas=3",
            "--set=operator.pollSeconds=5",
            "--set-string=operator.extraEnv.METIS_LOG_FORMAT=json",
        )
    )
    deployment = objects["Deployment", "metis-system", "metis-operator"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 3
    assert container["image"] == "registry.example/metis-operator:0.2.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["METIS_INDEXER_IMAGE"] == "ghcr.io/astraeus/metis-indexer:0.2.0"
    assert env["METIS_POLL_SECONDS"] == "5" and env["METIS_LOG_FORMAT"] == "json"


# --------------------------------------------------------------------------- kubeconform


def strict(schema: Any) -> Any:
    """A schema as kubeconform's -strict schemas are: every object with properties refuses
    any other (unless Kubernetes keeps unknown fields there), int-or-string and quantities
    take either form, and swagger's #/definitions/ references stay within the file."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("x-kubernetes-int-or-string") or schema.get("format") == "int-or-string":
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    return out


QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def references(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            yield ref.removeprefix("#/definitions/")
        for v in schema.values():
            yield from references(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from references(v)


def builtin_schemas(swagger: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(group, version, kind, schema) of each built-in kind, each schema holding the
    definitions it references."""
    definitions = {name: strict(d) for name, d in swagger["definitions"].items()}
    definitions[QUANTITY] = {"anyOf": [{"type": "number"}, {"type": "string"}]}
    for name, definition in definitions.items():
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            needed, todo = set(), [name]
            while todo:
                ref = todo.pop()
                if ref not in needed:
                    needed.add(ref)
                    todo.extend(references(definitions[ref]))
            schema = {
                **definition,
                "definitions": {n: definitions[n] for n in sorted(needed)},
            }
            yield gvk["group"], gvk["version"], gvk["kind"], schema


def crd_schemas(crd: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    spec = crd["spec"]
    for version in spec["versions"]:
        schema = strict(version["schema"]["openAPIV3Schema"])
        yield spec["group"], version["name"], spec["names"]["kind"], schema


def go_module_dir(module: str, cwd: Path) -> Path:
    """Where the Go module cache holds `module` (downloaded through the Go module proxy the
    first time on a machine; the control plane's build already fetched k8s.io/kubernetes)."""
    if shutil.which(os.environ.get("GO", "go")) is None:
        pytest.skip("Go is missing: the schemas come from Go modules")
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    out = run([os.environ.get("GO", "go"), "mod", "download", "-json", module], cwd=cwd, env=env)
    return Path(json.loads(out)["Dir"])


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Strict JSON schemas of every kind the chart renders, in the layout of kubeconform's
    -schema-location template {{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json
    (Group: an apiVersion's first part, so `v1` for the core group)."""
    folder = tmp_path_factory.mktemp("schemas")
    kubernetes = go_module_dir("k8s.io/kubernetes", KUBE_MODULE)
    swagger = json.loads((kubernetes / "api" / "openapi-spec" / "swagger.json").read_text())
    monitoring = go_module_dir(PROMETHEUS_OPERATOR, folder) / "example" / "prometheus-operator-crd"
    found = list(builtin_schemas(swagger))
    for crd in (
        ROOT / "crds" / "knowledgebase.yaml",
        monitoring / "monitoring.coreos.com_podmonitors.yaml",
        monitoring / "monitoring.coreos.com_prometheusrules.yaml",
    ):
        found.extend(crd_schemas(yaml.safe_load(crd.read_text())))
    for group, version, kind, schema in found:
        path = folder / (group or version) / f"{kind.lower()}_{version}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(schema))
    return folder


def conform(kubeconform: Path, schemas: Path, objects: list[dict[str, Any]]) -> dict[str, Any]:
    """kubeconform -strict's JSON report on `objects`, from our schemas alone (no download,
    and a kind without a schema is an error, not a skip)."""
    location = (
        f"{schemas}/{{{{ .Group }}}}/{{{{ .ResourceKind }}}}_{{{{ .ResourceAPIVersion }}}}.json"
    )
    out = subprocess.run(
        [
            str(kubeconform),
            "-strict",
            "-summary",
            "-output=json",
            f"-schema-location={location}",
            "-",
        ],
        input=yaml.safe_dump_all(objects),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = dict(json.loads(out.stdout))
    report["returncode"] = out.returncode
    return report


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_values_set_conforms_to_the_schemas(
    helm: Path, kubeconform: Path, schemas: Path, values: str
) -> None:
    """The chart's objects (the CRD among them) and the examples' KnowledgeBases, each against
    its kind's strict schema."""
    examples = [
        d for f in sorted((MANIFESTS / "examples").glob("*.yaml")) for d in documents(f.read_text())
    ]
    objects = template(helm, *VALUE_SETS[values]) + examples
    report = conform(kubeconform, schemas, objects)
    assert report["returncode"] == 0, json.dumps(report["resources"], indent=1)[:6000]
    summary = report["summary"]
    assert summary["valid"] == len(objects), summary
    assert summary["skipped"] == 0 and summary["invalid"] == 0 and summary["errors"] == 0


def test_kubeconform_refuses_a_misspelt_field(kubeconform: Path, schemas: Path, helm: Path) -> None:
    """The schemas are strict: a field no schema knows, in a built-in kind and in a base, fails
    (so the passing renders above are not passing for want of a rule)."""
    deployment = next(o for o in template(helm) if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicies"] = "Always"
    base = next(
        d
        for d in documents((MANIFESTS / "examples" / "handbook.yaml").read_text())
        if d["kind"] == "KnowledgeBase"
    )
    base["spec"]["replica"] = 2
    for wrong in (deployment, base):
        report = conform(kubeconform, schemas, [wrong])
        assert report["returncode"] != 0 and report["summary"]["invalid"] == 1, report


def test_helm_test_searches_the_base_it_is_given(helm: Path) -> None:
    """`helm test` runs one Pod hook: `metis search` of test.base through its Service, from the
    release namespace, under the restricted standard; none without a base."""
    assert not [o for o in template(helm) if o["kind"] == "Pod"]
    (pod,) = [o for o in template(helm, *VALUE_SETS["everything"]) if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == "metis-system"
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("ghcr.io/astraeus/metis-indexer:")
    assert container["command"][-2:] == [
        "http://metis-handbook.team-a.svc:7701",
        "How many holidays?",
    ]
    assert container["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
