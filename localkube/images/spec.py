"""image.json, validated (format: localkube/images/README.md), the spec that builds a reference, and the
files of an image's build context."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localkube.common import REPO, ClusterError
from localkube.images import oci

HERE = Path(__file__).resolve().parent
# Where image directories are looked up by reference: ours (pause, base) and the project's recipes.
SEARCH_DIRS = (HERE, REPO / "images")
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
SKIP_NAMES = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"}
SKIP_SUFFIXES = (".pyc", ".egg-info")
KNOWN_FIELDS = {
    "name",
    "tag",
    "base",
    "suite",
    "packages",
    "recipe",
    "context",
    "args",
    "user",
    "entrypoint",
    "cmd",
    "env",
    "workdir",
    "labels",
    "ports",
    "description",
}


@dataclass
class ImageSpec:
    """One image.json, validated."""

    dir: Path
    name: str
    tag: str
    base: str = "debian"
    suite: str = "bookworm"
    packages: list[str] = field(default_factory=list)
    recipe: Path | None = None
    context: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)
    allowed: dict[str, list[str]] = field(default_factory=dict)
    config: oci.ImageConfig = field(default_factory=oci.ImageConfig)

    @classmethod
    def load(cls, directory: Path) -> ImageSpec:
        path = directory / "image.json"
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ClusterError(f"{path}: cannot read: {e}") from None
        if not isinstance(doc, dict):
            raise ClusterError(f"{path}: must hold a JSON object")
        unknown = set(doc) - KNOWN_FIELDS
        if unknown:
            raise ClusterError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")

        def want(key: str, typ: type, default: Any = None) -> Any:
            value = doc.get(key, default)
            if value is None and default is None:
                raise ClusterError(f"{path}: field {key!r} is required")
            if not isinstance(value, typ):
                raise ClusterError(f"{path}: field {key!r} must be a {typ.__name__}")
            return value

        def str_list(key: str) -> list[str]:
            value = want(key, list, [])
            if not all(isinstance(v, str) for v in value):
                raise ClusterError(f"{path}: field {key!r} must be a list of strings")
            return list(value)

        def str_map(key: str) -> dict[str, str]:
            value = want(key, dict, {})
            if not all(isinstance(v, str) for v in value.values()):
                raise ClusterError(f"{path}: field {key!r} must map names to strings")
            return dict(value)

        args: dict[str, str] = {}
        allowed: dict[str, list[str]] = {}
        for key, value in want("args", dict, {}).items():
            values = [value] if isinstance(value, str) else value
            if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
                raise ClusterError(f"{path}: args.{key} must be a string or a non-empty list of strings")
            args[key], allowed[key] = values[0], list(values)
        base = want("base", str, "debian")
        if base not in ("debian", "scratch"):
            raise ClusterError(f'{path}: field \'base\' must be "debian" or "scratch", not {base!r}')
        try:
            rel_dir = str(directory.resolve().relative_to(REPO))
        except ValueError:
            rel_dir = ""
        context = str_list("context") or ([rel_dir] if rel_dir else [])
        for entry in context:
            if entry.startswith("/") or ".." in Path(entry).parts or not (REPO / entry).exists():
                raise ClusterError(f"{path}: context entry {entry!r} must be an existing repo-relative path")
        recipe_field = doc.get("recipe", "build.sh" if (directory / "build.sh").exists() else None)
        recipe: Path | None = None
        if recipe_field is not None:
            if not isinstance(recipe_field, str):
                raise ClusterError(f"{path}: field 'recipe' must be a string")
            for candidate in (REPO / recipe_field, directory / recipe_field):
                if candidate.is_file():
                    recipe = candidate.resolve()
                    break
            else:
                raise ClusterError(
                    f"{path}: field 'recipe' names {recipe_field!r}, which is neither a "
                    f"repo-relative file nor a file in {directory}"
                )
        if not doc.get("context"):
            context = _dockerignore_context(directory) or context
        return cls(
            dir=directory.resolve(),
            name=want("name", str),
            tag=want("tag", str),
            base=base,
            suite=want("suite", str, "bookworm"),
            packages=str_list("packages"),
            recipe=recipe,
            context=context,
            args=args,
            allowed=allowed,
            config=oci.ImageConfig(
                user=want("user", str, ""),
                entrypoint=str_list("entrypoint"),
                cmd=str_list("cmd"),
                env=str_map("env"),
                workdir=want("workdir", str, "/"),
                labels=str_map("labels"),
                exposed_ports=str_list("ports"),
            ),
        )

    def resolve_args(self, overrides: dict[str, str]) -> dict[str, str]:
        unknown = set(overrides) - set(self.args)
        if unknown:
            raise ClusterError(
                f"{self.dir}/image.json declares no arg(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(self.args)) or 'none'}"
            )
        for key, value in overrides.items():
            if len(self.allowed.get(key, [])) > 1 and value not in self.allowed[key]:
                raise ClusterError(
                    f"{self.dir}/image.json: args.{key}={value!r} is not one of "
                    f"{', '.join(self.allowed[key])}"
                )
        return {**self.args, **overrides}

    def variants(self) -> list[dict[str, str]]:
        """The build matrix: one args dict per combination of the listed values (images/README.md)."""
        keys = sorted(self.allowed)
        return [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.allowed[k] for k in keys))
        ] or [{}]

    def expand(self, text: str, args: dict[str, str]) -> str:
        """Replace ${NAME} with the build arg NAME (the shell/Dockerfile spelling images/ uses)."""

        def one(m: re.Match[str]) -> str:
            if m.group(1) not in args:
                raise ClusterError(f"{self.dir}/image.json uses ${{{m.group(1)}}}, which is not in 'args'")
            return args[m.group(1)]

        return VAR.sub(one, text)

    def ref(self, args: dict[str, str]) -> str:
        return f"{self.name}:{self.expand(self.tag, args)}"

    def image_config(self, args: dict[str, str]) -> oci.ImageConfig:
        c = self.config
        return oci.ImageConfig(
            user=self.expand(c.user, args),
            entrypoint=[self.expand(x, args) for x in c.entrypoint],
            cmd=[self.expand(x, args) for x in c.cmd],
            env={k: self.expand(v, args) for k, v in c.env.items()},
            workdir=self.expand(c.workdir, args),
            labels={k: self.expand(v, args) for k, v in c.labels.items()},
            exposed_ports=list(c.exposed_ports),
        )

    def args_for_tag(self, tag: str) -> dict[str, str] | None:
        """The args that make this spec's tag template produce tag, or None if it cannot."""
        pattern, names, pos = "", [], 0
        for m in VAR.finditer(self.tag):
            pattern += re.escape(self.tag[pos : m.start()]) + f"(?P<{m.group(1)}>[^:/]+)"
            names.append(m.group(1))
            pos = m.end()
        pattern += re.escape(self.tag[pos:])
        found = re.fullmatch(pattern, tag)
        if not found:
            return None
        return self.resolve_args({n: found.group(n) for n in names})


def _dockerignore_context(directory: Path) -> list[str]:
    """The context a `Dockerfile.dockerignore` of the form `*` + `!path` lines lets through."""
    ignore = directory / "Dockerfile.dockerignore"
    if not ignore.is_file():
        return []
    lines = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines or lines[0] != "*":
        return []
    keep = [ln[1:].strip("/") for ln in lines[1:] if ln.startswith("!")]
    return [k for k in keep if (REPO / k).exists()]


def find_specs() -> Iterator[ImageSpec]:
    for base in SEARCH_DIRS:
        if base.is_dir():
            for spec_file in sorted(base.glob("*/image.json")):
                yield ImageSpec.load(spec_file.parent)


def spec_for_ref(ref: str) -> tuple[ImageSpec, dict[str, str]]:
    name, _, tag = ref.rpartition(":")
    for spec in find_specs():
        if spec.name == name:
            args = spec.args_for_tag(tag)
            if args is not None:
                return spec, args
    known = ", ".join(f"{s.name}:{s.tag}" for s in find_specs())
    raise ClusterError(f"no image.json builds {ref}; known: {known}")


def context_files(spec: ImageSpec) -> list[Path]:
    files: list[Path] = []
    for entry in spec.context:
        top = REPO / entry
        if top.is_file():
            files.append(top)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_NAMES and not d.endswith(SKIP_SUFFIXES))
            files += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith(SKIP_SUFFIXES)]
    return files
