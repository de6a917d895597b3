"""The tree speaks only of the product: no machine-specific paths, no internal run, stop or session
numbers, no names of who worked on it, and no commit ids in the prose of the README and the guides.

Measurements are the exception for commit ids: an entry of a `bench/results-*.md` file says what it was
measured on (date, command, commit, machine, load), so the results files are not held to the rule on
commit ids; the guides and the README link to those entries instead of quoting them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()

# What is searched: the product's sources, tests, deployment files, images and documentation.
SEARCHED = (
    "README.md",
    "docs",
    "bench",
    "src",
    "tests",
    "localkube",
    "hack",
    "charts",
    "deploy",
    "images",
    "examples",
)
SKIPPED_PARTS = {"__pycache__", ".venv", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
TEXT_SUFFIXES = {
    ".md",
    ".py",
    ".sh",
    ".yaml",
    ".yml",
    ".json",
    ".toml",
    ".txt",
    ".tpl",
    ".env",
    ".cfg",
    ".ini",
    ".lock",
    ".mod",
    ".conf",
    "",
}

# Everywhere: the absolute paths of one machine's working copies and home directory.
MACHINE_PATH = re.compile(r"/work/|/root/(?!\.cache\b)")
# `/root/.cache` is allowed only where an image recipe empties the image's own root home.
IMAGE_ROOT_CACHE = re.compile(r"/root/\.cache\b")
IMAGE_BUILDERS = ("images/", "localkube/images/")
# Everywhere: scratch directories named after a working session or a person (/tmp/s13/, /tmp/h17/).
SCRATCH_PATH = re.compile(r"/tmp/(?:[sh]\d+|lk-h\d+|fo)/")
# Everywhere: internal numbering of working sessions and CI stops, and numbered contributors.
SESSION = re.compile(r"\bsessions? \d", re.IGNORECASE)
STOP = re.compile(r"\bstops? \d+\b", re.IGNORECASE)
NUMBERED_CONTRIBUTOR = re.compile(r"\bhelper[-_ ]?\d+\b", re.IGNORECASE)

# In the documentation (README, docs/, bench/*.md): who did the work is not the product's business.
CONTRIBUTOR = re.compile(r"\b(?:helpers?|coordinator|(?:other|another) developers?)\b", re.IGNORECASE)
# A personal scratch file or directory quoted in documentation (`--log /tmp/ci1.log`).
TMP_IN_DOCS = re.compile(r"(?<![\w/])/tmp/\w")
# In the README and docs/: results are cited by link, not by "run 6" of some log. A count of things
# ("runs 3 instances") is not a run number.
COUNTED = "|".join(
    [
        *("instances?", "replicas?", "clusters?", "pods?", "databases?", "quer(?:y|ies)", "statements?"),
        *("times", "trials?", "tests?", "workers?", "jobs?", "%"),
    ]
)
RUN_NUMBER = re.compile(rf"\bruns? \d+\b(?!\s*(?:{COUNTED}))", re.IGNORECASE)
# In the README and docs/: a commit id (7 to 40 hex digits with at least one digit and one letter).
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def files() -> Iterator[Path]:
    for name in SEARCHED:
        top = ROOT / name
        candidates = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in candidates:
            if not path.is_file() or path.resolve() == THIS or SKIPPED_PARTS & set(path.parts):
                continue
            if path.suffix in TEXT_SUFFIXES or path.name in {"Dockerfile", "Makefile"}:
                yield path


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def is_documentation(rel: str) -> bool:
    return rel == "README.md" or (rel.startswith(("docs/", "bench/")) and rel.endswith(".md"))


def is_guide(rel: str) -> bool:
    return rel == "README.md" or (rel.startswith("docs/") and rel.endswith(".md"))


def rules_for(rel: str) -> list[tuple[str, re.Pattern[str]]]:
    """Which rules apply depends on where a file is."""
    rules: list[tuple[str, re.Pattern[str]]] = [
        ("machine path", MACHINE_PATH),
        ("scratch path", SCRATCH_PATH),
        ("session number", SESSION),
        ("stop number", STOP),
        ("numbered contributor", NUMBERED_CONTRIBUTOR),
    ]
    if not rel.startswith(IMAGE_BUILDERS):
        rules.append(("machine path", IMAGE_ROOT_CACHE))
    if is_documentation(rel):
        rules += [("contributor", CONTRIBUTOR), ("scratch path", TMP_IN_DOCS)]
    if is_guide(rel):
        rules += [("run number", RUN_NUMBER), ("commit id", COMMIT_ID)]
    return rules


def findings_in(rel: str, text: str) -> list[str]:
    """Every line of the file at `rel` (from the repository root) that breaks a rule, as `rel:line: what`."""
    rules = rules_for(rel)
    out: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in rules:
            match = pattern.search(line)
            if match:
                out.append(f"{rel}:{number}: {what} {match.group(0)!r}")
    return out


def findings(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return []  # not a text file
    return findings_in(relative(path), text)


def test_the_tree_names_no_machine_session_run_or_contributor() -> None:
    found = [finding for path in files() for finding in findings(path)]
    assert not found, "\n".join(found)


def test_the_search_covers_the_tree() -> None:
    searched = {relative(path) for path in files()}
    assert {"README.md", "docs/README.md", "src/pg_operator/controller/reconcile.py"} <= searched
    assert any(name.startswith("bench/results-") for name in searched)
    assert any(name.startswith("images/postgres/") for name in searched)
    assert "tests/unit/test_tree_hygiene.py" not in searched  # it spells every pattern out


@pytest.mark.parametrize(
    ("rel", "line", "what"),
    [
        ("README.md", "see /work/main/docs", "machine path"),
        ("src/pg_operator/x.py", "# cached in /root/.cache/pg-operator", "machine path"),
        ("tests/unit/x.py", "# state in /root/lk", "machine path"),
        ("bench/results-x.md", "`--log /tmp/s13/ci.log`", "scratch path"),
        ("bench/results-x.md", "`--log /tmp/ci1.log`", "scratch path"),
        ("bench/results-x.md", "## 5. Floor, session 13 (2026-12-03)", "session number"),
        ("src/pg_operator/x.py", "# measured in session 8", "session number"),
        ("bench/results-x.md", "the CI of record (stop 24) took 2198 s", "stop number"),
        ("bench/results-x.md", "and helper-15's memory changes merged", "numbered contributor"),
        ("bench/results-x.md", "another helper's cluster ran beside it", "contributor"),
        ("bench/results-x.md", "two other developers' benchmarks ran beside it", "contributor"),
        ("docs/x.md", "the restore took 12 s (run 6)", "run number"),
        ("docs/x.md", "fixed in 0e0db0c", "commit id"),
        ("README.md", "at d8455ba", "commit id"),
        ("README.md", "at 40aaec8c1f0e5b6a7d8e9f0a1b2c3d4e5f6a7b8c", "commit id"),
    ],
)
def test_each_rule_catches_what_it_is_for(rel: str, line: str, what: str) -> None:
    found = findings_in(rel, f"fine\n{line}\n")
    assert any(f":2: {what} " in finding for finding in found), found


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("images/postgres/recipe.sh", "rm -rf /var/lib/apt/lists/* /root/.cache"),  # the image's own home
        ("src/pg_operator/x.py", "with tempfile.TemporaryDirectory(dir='/tmp/x') as d:"),
        ("docs/x.md", "a cluster that runs 3 instances"),
        ("docs/x.md", "a scrape runs 7 queries"),
        ("docs/x.md", "sessions of the operator pin their search path"),
        ("docs/x.md", "values.schema.json refuses a misspelt key; _helpers.tpl too"),
        ("docs/x.md", 'targetTime: "2026-12-01T08:30:00Z"'),
        ("docs/x.md", "a digest sha256:" + "ab12" * 16),
        # A results entry says what it was measured on, commit included.
        ("bench/results-x.md", "## 21. After the changes (2026-12-05, at 40aaec8)"),
        (
            "bench/results-x.md",
            "| 2026-12-05 01:20 | a6c7634 | warm | `python3 bench/bench_ci.py` | 2093 s |",
        ),
        ("tests/unit/x.py", 'roles=[{"name": "orders", "inRoles": ["helper"]}]'),
    ],
)
def test_what_the_rules_allow(rel: str, line: str) -> None:
    assert findings_in(rel, f"{line}\n") == []
