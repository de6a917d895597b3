"""deploy/namespaced/: the namespaced install grants in each watched namespace exactly what the
cluster-wide ClusterRole grants (less the cluster-scoped StorageClasses, Nodes and PersistentVolumes), and
nothing cluster-wide.
(The rendered overlay is applied and checked with the API server's authorizer in
tests/integration/test_operator_namespaced.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.paths import REPO

DEPLOY = REPO / "deploy"
NAMESPACED = DEPLOY / "namespaced"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str) -> dict[str, Any]:
    found = [d for d in docs(path) if d["kind"] == kind]
    assert len(found) == 1, f"{path}: {len(found)} {kind}"
    return found[0]


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Every (apiGroup, resource, verb, resourceNames) a set of rules grants."""
    return {
        (group, resource, verb, tuple(rule.get("resourceNames") or ()))
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


CLUSTER_SCOPED = {"storageclasses", "nodes", "persistentvolumes"}


def test_the_namespaced_role_mirrors_the_cluster_role_without_cluster_scoped_kinds() -> None:
    cluster_role = one(DEPLOY / "operator" / "rbac.yaml", "ClusterRole")
    role = one(NAMESPACED / "watch" / "base" / "role.yaml", "Role")
    wanted = {r for r in rule_set(cluster_role["rules"]) if r[1] not in CLUSTER_SCOPED}
    assert rule_set(role["rules"]) == wanted
    # The rule that patches credential Secrets is there too.
    assert ("", "secrets", "patch", ()) in rule_set(role["rules"])


def test_the_overlay_deletes_the_cluster_wide_grants_and_adds_only_namespaced_ones() -> None:
    kustomization = yaml.safe_load((NAMESPACED / "kustomization.yaml").read_text())
    deleted = set()
    for patch in kustomization["patches"]:
        body = yaml.safe_load(patch["patch"])
        assert body["$patch"] == "delete"
        deleted.add((body["kind"], body["metadata"]["name"]))
    assert deleted == {("ClusterRole", "pg-operator"), ("ClusterRoleBinding", "pg-operator")}
    cluster_scoped_rbac = [
        d["kind"] for path in NAMESPACED.rglob("*.yaml") for d in docs(path)
        if d.get("kind") in ("ClusterRole", "ClusterRoleBinding")
    ]  # fmt: skip
    assert cluster_scoped_rbac == []
    # The cluster-wide install holds nothing else cluster-wide: only the ClusterRole's binding.
    kinds = [d["kind"] for d in docs(DEPLOY / "operator" / "rbac.yaml")]
    assert kinds.count("ClusterRole") == 1 and kinds.count("ClusterRoleBinding") == 1


def test_each_watched_namespace_component_names_its_namespace_in_the_args_and_the_rbac() -> None:
    kustomization = yaml.safe_load((NAMESPACED / "kustomization.yaml").read_text())
    assert kustomization["components"], "the namespaced install watches no namespace"
    for entry in kustomization["components"]:
        component = yaml.safe_load((NAMESPACED / entry / "kustomization.yaml").read_text())
        assert component["kind"] == "Component"
        rbac = yaml.safe_load((NAMESPACED / entry / "rbac" / "kustomization.yaml").read_text())
        ops = [op for patch in component["patches"] for op in yaml.safe_load(patch["patch"])]
        assert ops == [
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": f"--namespace={rbac['namespace']}"}
        ], entry  # fmt: skip
        assert rbac["resources"] == ["../../base"], entry


# --- Least privilege: the ClusterRole is the table of docs/security.md, and grants nothing unused -------

SECURITY_DOC = REPO / "docs" / "security.md"
# Verbs the operator's code never sends (it writes by server-side apply and merge patches, posts Events
# with create only, and reads everything but a few objects through its watch cache).
UNUSED = [
    ("", "pods", "update"),
    ("", "configmaps", "update"),
    ("", "events", "patch"),
    ("", "persistentvolumeclaims", "get"),
    ("db.example.com", "postgresclusters", "get"),
    ("db.example.com", "backups", "patch"),
    ("db.example.com", "scheduledbackups", "create"),
    ("db.example.com", "backups/finalizers", "update"),
    ("storage.k8s.io", "storageclasses", "get"),
    ("", "nodes", "get"),
    ("discovery.k8s.io", "endpointslices", "get"),
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("", "persistentvolumes", "delete"),
    ("", "persistentvolumes", "list"),
]


def documented_rules() -> set[tuple[str, str, str, tuple[str, ...]]]:
    """The grants docs/security.md's table under "What the operator may do" lists: one row per group and
    resources, `core` for the core group."""
    section = SECURITY_DOC.read_text().split("## What the operator may do", 1)[1].split("\n## ", 1)[0]
    grants = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[2].startswith("`"):
            continue
        group = "" if cells[0] == "core" else cells[0].strip("`")
        resources = [r.strip().strip("`") for r in cells[1].split(",")]
        verbs = [v.strip().strip("`") for v in cells[2].split(",")]
        grants |= {(group, r, v, ()) for r in resources for v in verbs}
    assert grants, "docs/security.md has no table of the operator's grants"
    return grants


def test_the_cluster_role_is_the_documented_table() -> None:
    cluster_role = one(DEPLOY / "operator" / "rbac.yaml", "ClusterRole")
    assert rule_set(cluster_role["rules"]) == documented_rules()


def test_no_verb_nothing_uses_is_granted() -> None:
    for path, kind in ((DEPLOY / "operator" / "rbac.yaml", "ClusterRole"),
                       (NAMESPACED / "watch" / "base" / "role.yaml", "Role")):  # fmt: skip
        granted = {(group, resource, verb) for group, resource, verb, _ in rule_set(one(path, kind)["rules"])}
        assert granted & set(UNUSED) == set(), f"{path.name}: {sorted(granted & set(UNUSED))}"
