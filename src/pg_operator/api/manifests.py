"""Generate the committed CRD manifests from the models: `python -m pg_operator.api.manifests [--check]`.

Without arguments it (re)writes deploy/crd/postgresclusters.yaml, backups.yaml and scheduledbackups.yaml,
and the same files in the Helm chart's crds/ (a packaged chart cannot read outside its directory); with
--check it writes nothing and exits 1 when a committed file differs from what the models generate.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import yaml

from pg_operator.api.backup import BACKUP, SCHEDULED_BACKUP
from pg_operator.api.cluster import POSTGRES_CLUSTER
from pg_operator.api.crd import CustomResource, build

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CRD_DIR = REPO_ROOT / "deploy" / "crd"
CHART_CRD_DIR = REPO_ROOT / "charts" / "pg-operator" / "crds"
COMMAND = "python -m pg_operator.api.manifests"
# Every kind the operator serves, each written to deploy/crd/<plural>.yaml.
KINDS: tuple[CustomResource, ...] = (POSTGRES_CLUSTER, BACKUP, SCHEDULED_BACKUP)


def render(kind: CustomResource) -> str:
    """One kind's CRD as YAML text: sorted keys, fixed width, so equal models give byte-equal files."""
    crd = build(kind)
    body = yaml.safe_dump(crd, sort_keys=True, width=120, allow_unicode=True, default_flow_style=False)
    return f"# Generated from {kind.source} by `{COMMAND}`. Do not edit.\n" + body


def rendered_files() -> dict[str, str]:
    """File name (within the CRD directory) → content, for every kind."""
    return {f"{kind.plural}.yaml": render(kind) for kind in KINDS}


def write_manifests(out_dir: Path = DEFAULT_CRD_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered_files().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def drift(out_dir: Path = DEFAULT_CRD_DIR) -> list[str]:
    """Unified diffs, one per file that differs from what the models generate; empty when in sync."""
    diffs = []
    for name, text in rendered_files().items():
        path = out_dir / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            diffs.append(
                "".join(
                    difflib.unified_diff(
                        current.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        fromfile=f"{path} (committed)",
                        tofile=f"{path} (generated)",
                    )
                )
            )
    return diffs


def main(argv: list[str] | None = None, *, check: bool | None = None) -> int:
    """Command line entry; `check=` lets other CLIs (pg-operator manifests) call it without argv."""
    parser = argparse.ArgumentParser(prog=COMMAND, description="Generate the CRD manifest from the models.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files are stale")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_CRD_DIR, help="CRD directory")
    args = parser.parse_args([] if argv is None and check is not None else argv)
    if check is not None:
        args.check = check
    # The chart's copies too, from a checkout (an installed package has no chart beside it).
    chart = args.out_dir == DEFAULT_CRD_DIR and CHART_CRD_DIR.parent.is_dir()
    out_dirs = [args.out_dir] + ([CHART_CRD_DIR] if chart else [])
    if args.check:
        diffs = [d for out in out_dirs for d in drift(out)]
        if diffs:
            sys.stdout.write("".join(diffs))
            where = " and ".join(str(out) for out in out_dirs)
            print(f"\nthe CRDs in {where} are stale; regenerate them with `{COMMAND}`", file=sys.stderr)
            return 1
        for out in out_dirs:
            print(f"{out}: up to date")
        return 0
    for out in out_dirs:
        for path in write_manifests(out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
