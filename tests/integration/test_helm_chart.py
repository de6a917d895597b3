"""The Helm chart (charts/pg-operator) against deploy/: `helm lint --strict` in both modes; the rendered
RBAC rules, Deployment and monitoring objects equal those of `kubectl apply -k deploy/` (cluster-wide),
of the deploy/namespaced/ overlay (namespaced) and of deploy/monitoring/, so the two installs cannot
drift; then the namespaced mode `helm install`ed on the kwok cluster (every object accepted by the API
server, the ServiceAccount's grants checked with the API server's authorizer), `helm upgrade`d to one
watched namespace less, and `helm uninstall`ed (everything gone but the CRDs). The cluster-wide mode
runs on real pods in every e2e module: the e2e tier installs its operator from this chart
(tests/harness/deployed_operator.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from localkube.common import Context

from harness.deployed_operator import CHART, OPERATOR_NAMESPACE, helm, namespaced_overlay
from harness.kube import get_json, get_or_none
from harness.local_cluster import Kube
from harness.paths import REPO
from pg_operator.cli.main import build_parser

DEPLOY = REPO / "deploy"
RELEASE = "pg-operator"  # as the e2e tier installs it: every name is then deploy/'s
# Flags the chart passes that deploy/ leaves at the operator's default.
CHART_ONLY_ARGS = ["--log-level=info"]
# Labels the chart adds to every object and to the pod template (Helm's and the release's).
CHART_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                "helm.sh/chart"}  # fmt: skip
# The admission policies that keep the operator's exec and ephemeral containers to its own pods.
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
MONITORING = [
    "--set", "monitoring.serviceMonitor.enabled=true",
    "--set", "monitoring.podMonitor.enabled=true",
    "--set", "monitoring.prometheusRule.enabled=true",
]  # fmt: skip


class LocalKubectl:
    """kubectl for what needs no API server (kustomize), so the render tests need no cluster."""

    def __init__(self) -> None:
        self.ctx = Context()
        self.kubeconfig = ""  # none: kustomize reads only files

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
        res = subprocess.run([self.ctx.binary("kubectl"), *args], input=input, capture_output=True,
                             text=True, timeout=timeout)  # fmt: skip
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{res.stderr}")
        return res


def helm_local(*args: str) -> str:
    """helm for what needs no cluster (lint, template)."""
    res = subprocess.run([Context().binary("helm"), *args], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res.stdout


def render(*values: str, namespace: str = OPERATOR_NAMESPACE, release: str = RELEASE) -> list[dict[str, Any]]:
    out = helm_local("template", release, str(CHART), "--namespace", namespace, *values)
    return [d for d in yaml.safe_load_all(out) if d]


def watching(namespaces: Sequence[str]) -> list[str]:
    return ["--set", "watchNamespaces={" + ",".join(namespaces) + "}"]


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def find(objects: Sequence[dict[str, Any]], kind: str, name: str, namespace: str | None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name
             and o["metadata"].get("namespace") == namespace]  # fmt: skip
    assert len(found) == 1, f"{len(found)} {kind} {namespace}/{name}"
    return found[0]


def identities(objects: Sequence[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    """(kind, name, namespace) of every object but the Namespace and the CRDs (which the chart leaves to
    `--create-namespace` and its crds/ directory)."""
    return {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects
            if o["kind"] not in ("Namespace", "CustomResourceDefinition")}  # fmt: skip


def comparable_deployment(deployment: dict[str, Any]) -> dict[str, Any]:
    """A chart's Deployment spec less what the chart adds on purpose: its flags left at the operator's
    defaults in deploy/, and Helm's labels on the pod template."""
    spec = copy.deepcopy(deployment["spec"])
    pod = spec["template"]
    pod["metadata"]["labels"] = {k: v for k, v in pod["metadata"]["labels"].items() if k not in CHART_LABELS}
    container = pod["spec"]["containers"][0]
    for arg in CHART_ONLY_ARGS:
        assert arg in container["args"], arg
        container["args"].remove(arg)
    return dict(spec)


def test_chart_only_args_are_the_operators_defaults() -> None:
    """What the chart passes beyond deploy/ changes nothing: the operator's own defaults."""
    parsed = build_parser().parse_args(["run", *CHART_ONLY_ARGS])
    assert vars(parsed) == vars(build_parser().parse_args(["run"]))


def test_lint_is_clean_in_both_modes() -> None:
    own_account = [
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=ops",
        "--set",
        "rbac.create=false",
    ]
    for values in ([], [*watching(["shop", "billing"]), *MONITORING], [*REGISTRY_VALUES, *own_account]):
        out = helm_local("lint", "--strict", str(CHART), *values)
        assert "0 chart(s) failed" in out, out
        assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_the_packaged_chart_renders_the_same(tmp_path: Path) -> None:
    """A packaged chart holds only its own directory: nothing it renders may come from outside it."""
    helm_local("package", str(CHART), "--destination", str(tmp_path))
    (packaged,) = tmp_path.glob("pg-operator-*.tgz")
    values = [*watching(["shop"]), *MONITORING]
    out = helm_local("template", RELEASE, str(packaged), "--namespace", OPERATOR_NAMESPACE, *values)
    assert [d for d in yaml.safe_load_all(out) if d] == render(*values)


def test_bad_values_are_refused_naming_the_field() -> None:
    for values, field in ((["--set", "watchNamespaces={Shop}"], "/watchNamespaces/0"),
                          (["--set", "logLevel=verbose"], "/logLevel"),
                          (["--set", "logFormat=xml"], "/logFormat"),
                          (["--set", "replicaCount=3"], "replicaCount")):  # fmt: skip
        res = subprocess.run([Context().binary("helm"), "template", RELEASE, str(CHART), *values],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert res.returncode != 0 and field in res.stderr, (values, res.stderr)


def test_cluster_wide_mode_renders_deploy() -> None:
    chart = render()
    deployed = [d for path in (DEPLOY / "operator").glob("*.yaml") if path.name != "kustomization.yaml"
                for d in yaml_docs(path)]  # fmt: skip
    assert identities(chart) == identities(deployed)
    for kind, name, namespace in identities(deployed):
        ours, theirs = find(chart, kind, name, namespace), find(deployed, kind, name, namespace)
        if "rules" in theirs:  # ClusterRole, the Lease's Role: the same rules in the same order
            assert ours["rules"] == theirs["rules"], f"{kind} {name}"
        if "subjects" in theirs:
            assert (ours["subjects"], ours["roleRef"]) == (theirs["subjects"], theirs["roleRef"]), name
        if kind in ADMISSION_KINDS:  # the exec and ephemeral-container policies and their bindings
            assert ours["spec"] == theirs["spec"], f"{kind} {name}"
        assert {k: v for k, v in ours["metadata"].get("labels", {}).items() if k not in CHART_LABELS} == (
            theirs["metadata"].get("labels") or {}), f"{kind} {name}"  # fmt: skip
    ours = find(chart, "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    theirs = find(deployed, "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    assert comparable_deployment(ours) == theirs["spec"]
    # The arguments are ones `pg-operator run` accepts.
    build_parser().parse_args(["run", *ours["spec"]["template"]["spec"]["containers"][0]["args"]])
    # Monitoring is off by default.
    assert not [o for o in chart if o["apiVersion"].startswith("monitoring.coreos.com/")]


def test_namespaced_mode_renders_the_overlay(tmp_path: Path) -> None:
    watched = ["shop", "billing"]
    chart = render(*watching(watched))
    overlay = namespaced_overlay(LocalKubectl(), tmp_path, watched)
    assert identities(chart) == identities(overlay)
    assert not [o for o in chart if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    for kind, name, namespace in identities(overlay):
        ours, theirs = find(chart, kind, name, namespace), find(overlay, kind, name, namespace)
        if "rules" in theirs:
            assert ours["rules"] == theirs["rules"], f"{kind} {namespace}/{name}"
        if "subjects" in theirs:
            assert (ours["subjects"], ours["roleRef"]) == (theirs["subjects"], theirs["roleRef"]), name
        if kind in ADMISSION_KINDS:
            assert ours["spec"] == theirs["spec"], f"{kind} {name}"
    ours = find(chart, "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    theirs = find(overlay, "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    assert comparable_deployment(ours) == theirs["spec"]
    args = ours["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_parser().parse_args(["run", *args]).namespaces == watched


def test_the_admission_policies_name_the_releases_service_account() -> None:
    """Another release name and namespace: the policies apply to that release's ServiceAccount, and the
    policies and their bindings are named after the release (two releases must not collide)."""
    chart = render(namespace="dbs", release="tenant-db")
    policies = [o for o in chart if o["kind"] == "ValidatingAdmissionPolicy"]
    assert sorted(p["metadata"]["name"] for p in policies) == ["tenant-db-pg-operator-ephemeral-containers",
                                                               "tenant-db-pg-operator-exec"]  # fmt: skip
    for policy in policies:
        (match,) = policy["spec"]["matchConditions"]
        assert match["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:dbs:tenant-db-pg-operator'"
        )
    bindings = [o for o in chart if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    bound = sorted(b["spec"]["policyName"] for b in bindings)
    assert bound == sorted(p["metadata"]["name"] for p in policies)


def test_monitoring_objects_are_deploys() -> None:
    chart = render(*MONITORING)
    monitoring = DEPLOY / "monitoring"
    for path in ("operator-metrics-service.yaml", "servicemonitor.yaml", "podmonitor.yaml",
                 "prometheus-rule.yaml"):  # fmt: skip
        (theirs,) = yaml_docs(monitoring / path)
        ours = find(chart, theirs["kind"], theirs["metadata"]["name"], theirs["metadata"]["namespace"])
        assert ours["spec"] == theirs["spec"], path
    # The PrometheusRule carries the rule file's groups, Prometheus' own {{ $labels }} templates intact.
    rule = find(chart, "PrometheusRule", "pg-operator", OPERATOR_NAMESPACE)
    assert rule["spec"] == yaml.safe_load((monitoring / "prometheus-rules.yaml").read_text())
    assert "{{ $labels.namespace }}" in yaml.safe_dump(rule)
    # Extra labels (what a Prometheus selects monitors by) reach every monitoring object.
    labelled = render(*MONITORING, "--set", "monitoring.labels.release=prom")
    monitors = [o for o in labelled if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert len(monitors) == 3 and all(o["metadata"]["labels"]["release"] == "prom" for o in monitors)


# --- On the kwok cluster: the namespaced mode installed and uninstalled -----------------------------


def resource(obj: dict[str, Any]) -> str:
    """kubectl's name of an object's resource, with its API group (role.rbac.authorization.k8s.io)."""
    group = obj["apiVersion"].rpartition("/")[0]
    return f"{obj['kind'].lower()}.{group}" if group else str(obj["kind"]).lower()


def can_i(kube: Kube, user: str, verb: str, resource: str, *where: str) -> bool:
    kind, _, sub = resource.partition(":")
    extra = [f"--subresource={sub}"] if sub else []
    res = kube.kubectl("auth", "can-i", verb, kind, *extra, f"--as={user}", *where, check=False)
    answer = str(res.stdout).strip()
    assert answer in ("yes", "no"), res.stderr
    return answer == "yes"


# What the namespaced operator's ServiceAccount may and may not do (the API server's authorizer answers).
IN_WATCHED = [
    ("create", "pods:exec"),
    ("get", "pods:exec"),
    ("create", "secrets"),
    ("patch", "secrets"),
    ("delete", "statefulsets.apps"),
    ("patch", "postgresclusters.db.example.com"),
    ("patch", "postgresclusters.db.example.com:status"),
    ("update", "postgresclusters.db.example.com:finalizers"),
    ("create", "roles.rbac.authorization.k8s.io"),
]
NOT_IN_WATCHED = [
    ("update", "secrets"),
    ("update", "postgresclusters.db.example.com"),
    ("create", "leases.coordination.k8s.io"),
    # Verbs nothing in the operator sends (docs/security.md).
    ("update", "pods"),
    ("update", "configmaps"),
    ("patch", "events"),
    ("update", "backups.db.example.com:finalizers"),
]
NOT_ELSEWHERE = [("create", "pods:exec"), ("get", "secrets"), ("list", "pods")]
NOT_CLUSTER_WIDE = [("list", "secrets"), ("create", "pods:exec"), ("list", "postgresclusters.db.example.com"),
                    ("list", "storageclasses.storage.k8s.io"),
                    ("get", "customresourcedefinitions.apiextensions.k8s.io")]  # fmt: skip
CRDS = ("postgresclusters", "backups", "scheduledbackups")


@pytest.fixture
def namespaces(kube: Kube) -> Iterator[dict[str, str]]:
    """The release's namespace (made by `helm install --create-namespace`), two watched ones and one
    that is not watched; all deleted afterwards."""
    suffix = uuid.uuid4().hex[:6]
    names = {"release": f"helm-rel-{suffix}", "watched": f"helm-a-{suffix}", "watched2": f"helm-b-{suffix}",
             "other": f"helm-other-{suffix}"}  # fmt: skip
    for key in ("watched", "watched2", "other"):
        kube.kubectl("create", "namespace", names[key])
    yield names
    for name in names.values():
        kube.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def test_namespaced_install_and_uninstall(kube: Kube, namespaces: dict[str, str]) -> None:
    release = f"pg-operator-{namespaces['release'][-6:]}"  # it holds the chart's name: objects are named so
    ns, watched = namespaces["release"], [namespaces["watched"], namespaces["watched2"]]
    installed = helm(kube, "install", release, str(CHART), "--namespace", ns, "--create-namespace",
                     *watching(watched), "--wait", "--timeout=180s")  # fmt: skip
    # NOTES.txt tells the user what was installed and how to go on.
    assert f"Namespaced install: it acts only in {', '.join(watched)}" in installed.stdout, installed.stdout
    assert f"rollout status deployment/{release}" in installed.stdout
    try:
        listed = helm(kube, "get", "manifest", release, "-n", ns).stdout
        manifest = [d for d in yaml.safe_load_all(listed) if d]
        assert identities(manifest) == identities(render(*watching(watched), namespace=ns, release=release))
        # Every object is in the API server, owned by the release; the fake pods are Ready.
        for obj in manifest:
            where = ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []
            live = get_json(kube, resource(obj), obj["metadata"]["name"], *where)
            assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        assert get_json(kube, "deployment", release, "-n", ns)["status"].get("readyReplicas") == 2
        for crd in CRDS:
            conditions = get_json(kube, "crd", f"{crd}.db.example.com")["status"]["conditions"]
            assert any(c["type"] == "Established" and c["status"] == "True" for c in conditions), crd

        user = f"system:serviceaccount:{ns}:{release}"
        for namespace in watched:
            for verb, what in IN_WATCHED:
                assert can_i(kube, user, verb, what, "-n", namespace), f"{verb} {what} in {namespace}"
            for verb, what in NOT_IN_WATCHED:
                assert not can_i(kube, user, verb, what, "-n", namespace), f"{verb} {what} in {namespace}"
        for verb, what in NOT_ELSEWHERE:
            assert not can_i(kube, user, verb, what, "-n", namespaces["other"]), f"{verb} {what} elsewhere"
        for verb, what in NOT_CLUSTER_WIDE:
            assert not can_i(kube, user, verb, what, "-A"), f"{verb} {what} cluster-wide"
        assert can_i(kube, user, "create", "leases.coordination.k8s.io", "-n", ns)
        assert can_i(kube, user, "update", "leases.coordination.k8s.io/pg-operator-leader", "-n", ns)
        assert not can_i(kube, user, "update", "leases.coordination.k8s.io/other", "-n", ns)
        bindings = get_json(kube, "clusterrolebindings")["items"]
        bound = [b["metadata"]["name"] for b in bindings for s in b.get("subjects") or ()
                 if (s.get("name"), s.get("namespace")) == (release, ns)]  # fmt: skip
        assert bound == []

        # helm upgrade: one namespace less. Its Role goes, the operator's flags follow, the rest stays.
        helm(kube, "upgrade", release, str(CHART), "--namespace", ns, *watching(watched[:1]), "--wait",
             "--timeout=180s")  # fmt: skip
        history = json.loads(helm(kube, "history", release, "-n", ns, "-o", "json").stdout)
        assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed", history
        assert get_or_none(kube, "role", release, "-n", watched[1]) is None
        assert not can_i(kube, user, "create", "pods:exec", "-n", watched[1])
        assert can_i(kube, user, "create", "pods:exec", "-n", watched[0])
        pod_spec = get_json(kube, "deployment", release, "-n", ns)["spec"]["template"]["spec"]
        args = pod_spec["containers"][0]["args"]
        assert f"--namespace={watched[0]}" in args and f"--namespace={watched[1]}" not in args, args
        listed = helm(kube, "get", "manifest", release, "-n", ns).stdout
        manifest = [d for d in yaml.safe_load_all(listed) if d]
    finally:
        helm(kube, "uninstall", release, "-n", ns, "--wait", "--timeout=180s")

    # Everything the release made is gone; the CRDs (Helm never deletes crds/) and the namespaces stay.
    for obj in manifest:
        where = ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []
        gone = get_or_none(kube, resource(obj), obj["metadata"]["name"], *where) is None
        assert gone, f"{resource(obj)} {obj['metadata']['name']} survived the uninstall"
    for crd in CRDS:
        assert get_or_none(kube, "crd", f"{crd}.db.example.com") is not None
    for namespace in watched:
        assert get_or_none(kube, "namespace", namespace) is not None


# --- Images from a registry of one's own, the chart's ServiceAccount and RBAC switches ----------------

REGISTRY = "registry.example.com/pg"
REGISTRY_VALUES = [
    "--set", f"image.repository={REGISTRY}/operator",
    "--set", f"images.postgres.repository={REGISTRY}/postgres",
    "--set", "imagePullSecrets[0].name=regcred",
]  # fmt: skip


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"] if "valueFrom" not in e}


def image_settings(deployment: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the operator of this Deployment runs with: its arguments, with its environment."""
    from pg_operator.cli.main import image_options

    for name, value in env_of(deployment).items():
        if name.startswith("PG_OPERATOR_"):  # not its HOME
            monkeypatch.setenv(name, value)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return image_options(build_parser().parse_args(["run", *container["args"]]))


def test_the_registry_values_reach_the_operator_and_the_pods_it_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pg_operator.images import ImageSettings

    ours = find(render(*REGISTRY_VALUES), "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    pod = ours["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["image"] == f"{REGISTRY}/operator:0.1.0"
    settings, allowed = image_settings(ours, monkeypatch)
    # The pooler's image follows the operator's unless images.pooler says otherwise.
    assert settings == ImageSettings(f"{REGISTRY}/postgres", f"{REGISTRY}/operator", "0.1.0", ("regcred",))
    assert allowed.entries == (f"{REGISTRY}/postgres",)

    pinned = render(*REGISTRY_VALUES, "--set", "images.pooler.repository=other.example.com/bouncer",
                    "--set", "images.pooler.tag=1.2",
                    "--set", "allowedImageRepositories={other.example.com/}")  # fmt: skip
    settings, allowed = image_settings(
        find(pinned, "Deployment", "pg-operator", OPERATOR_NAMESPACE), monkeypatch
    )
    assert settings.pooler_image == "other.example.com/bouncer:1.2"
    assert allowed.entries == ("other.example.com/",)


def test_the_registry_overlay_is_the_charts_registry_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/registry (kustomize) and the chart with the same registry give the same Deployment."""
    rendered = LocalKubectl().kubectl("kustomize", str(DEPLOY / "registry")).stdout
    overlay = [d for d in yaml.safe_load_all(rendered) if d]
    theirs = find(overlay, "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    ours = comparable_deployment(
        find(render(*REGISTRY_VALUES), "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    )
    assert env_of({"spec": ours}) == env_of(theirs)  # kustomize puts the patched variables first
    for spec in (ours, theirs["spec"]):
        spec["template"]["spec"]["containers"][0].pop("env")
    assert ours == theirs["spec"]
    # Everything else is deploy/'s.
    assert identities(overlay) - identities(yaml_docs(DEPLOY / "operator" / "deployment.yaml")) == identities(
        [d for path in (DEPLOY / "operator").glob("*.yaml") if path.name not in ("kustomization.yaml",
         "deployment.yaml") for d in yaml_docs(path)])  # fmt: skip


def test_service_account_and_rbac_switches() -> None:
    existing = render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-ops")
    assert not [o for o in existing if o["kind"] == "ServiceAccount"]
    deployment = find(existing, "Deployment", "pg-operator", OPERATOR_NAMESPACE)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "platform-ops"
    for binding in (o for o in existing if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "platform-ops",
                                        "namespace": OPERATOR_NAMESPACE}]  # fmt: skip
    for policy in (o for o in existing if o["kind"] == "ValidatingAdmissionPolicy"):
        (match,) = policy["spec"]["matchConditions"]
        assert match["expression"].endswith(f"'system:serviceaccount:{OPERATOR_NAMESPACE}:platform-ops'")

    named = render("--set", "serviceAccount.name=pgop", "--set", "serviceAccount.annotations.team=db")
    (account,) = [o for o in named if o["kind"] == "ServiceAccount"]
    assert account["metadata"]["name"] == "pgop" and account["metadata"]["annotations"] == {"team": "db"}

    for values in ([], watching(["shop"])):
        without = render("--set", "rbac.create=false", *values)
        kinds = {o["kind"] for o in without}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}, kinds
        assert {"Deployment", "ServiceAccount", "ValidatingAdmissionPolicy"} <= kinds


def test_chart_conventions_are_enforced() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"
    for values, needle in (
        (["--kube-version", "1.29.0"], "chart requires kubeVersion: >=1.30.0-0"),
        (
            ["--set", "serviceAccount.create=false"],
            "serviceAccount.name: the name of an existing ServiceAccount",
        ),
        (["--set", "images.postgres.repository=reg.example.com/pg:16"], "/images/postgres/repository"),
        (["--set", "imagePullSecrets[0].name=Reg_Cred"], "/imagePullSecrets/0/name"),
        (["--set", "images.pooler.tag=:1"], "/images/pooler/tag"),
        (["--set", "rbac.enabled=true"], "enabled"),
    ):
        res = subprocess.run([Context().binary("helm"), "template", RELEASE, str(CHART), *values],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert res.returncode != 0 and needle in res.stderr, (values, res.stderr)
