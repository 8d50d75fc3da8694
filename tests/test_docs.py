"""The README is a front door and docs/ holds the reference: its links resolve, every config field is documented.

No Spark, no services: these read files and walk the pydantic models of `lakestream/config.py`.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from lakestream.config import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
README_MAX_LINES = 220

# Fields the YAML takes but a reader has no reason to set. Each with its reason; keep this short.
UNDOCUMENTED_FIELDS: dict[str, str] = {}

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a markdown file, numbered as GitHub numbers repeated headings."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        match = re.match(r"^#{1,6} (.*?)\s*#*\s*$", line)
        if in_fence or not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(markdown: str) -> list[str]:
    """The links of a markdown file to files of this tree or to its own headings, outside code blocks."""
    links: list[str] = []
    in_fence = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            links += [target for target in _LINK.findall(line) if not re.match(r"^[a-z]+:", target)]
    return links


def docs_links(markdown: str) -> list[str]:
    """The relative links into docs/."""
    return [link for link in relative_links(markdown) if link.startswith(("docs/", "./docs/"))]


def broken_links(markdown_file: Path, links: list[str] | None = None) -> list[str]:
    """Each link (default: every relative link of the file) that names a missing file, or a heading its target
    does not have."""
    broken = []
    for link in relative_links(markdown_file.read_text()) if links is None else links:
        path, _, anchor = link.partition("#")
        target = (markdown_file.parent / path).resolve() if path else markdown_file
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and (not target.is_file() or anchor not in anchors(target.read_text())):
            broken.append(f"{link}: {path or markdown_file.name} has no heading #{anchor}")
    return broken


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def config_fields(root: type[BaseModel] = PipelineConfig) -> dict[str, str]:
    """Every field of the config models reachable from `root`, as YAML names it: {dotted path: name}."""
    fields: dict[str, str] = {}
    visited: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        if model in visited:
            return
        visited.add(model)
        for attribute, info in model.model_fields.items():
            name = info.alias or attribute
            path = f"{prefix}{name}"
            fields[path] = name
            for nested in _models_in(info.annotation):
                walk(nested, f"{path}.")

    walk(root, "")
    return fields


REFERENCE_HEADING = "## Reference: every field"
TOP_LEVEL = "The top level"


def reference_fields(markdown: str) -> set[str]:
    """The fields the reference lists, as dotted paths: each `### `section`` heading's table rows `| `field` |`."""
    listed: set[str] = set()
    _, found, reference = markdown.partition(REFERENCE_HEADING)
    assert found, f"docs/configuration.md has no {REFERENCE_HEADING!r}"
    section: str | None = None
    for line in reference.splitlines():
        if line.startswith("## "):
            break
        heading = re.match(r"^### (?:`([\w.]+)`|(.+))$", line)
        if heading:
            section = heading.group(1) if heading.group(1) else ("" if heading.group(2) == TOP_LEVEL else None)
            continue
        row = re.match(r"^\| `(\w+)` \|", line)
        if row and section is not None:
            listed.add(f"{section}.{row.group(1)}" if section else row.group(1))
    return listed


def test_readme_docs_links_resolve() -> None:
    links = docs_links(README.read_text())
    assert links, "the README links no docs/ page"
    assert broken_links(README, links) == []


def test_docs_pages_links_resolve() -> None:
    """The README's other links, and the docs/ pages' links to each other and to their own headings."""
    assert broken_links(README) == []
    broken = [f"{page.name}: {b}" for page in sorted((ROOT / "docs").glob("**/*.md")) for b in broken_links(page)]
    assert broken == []


def test_every_config_field_is_in_configuration_md() -> None:
    listed = reference_fields(CONFIGURATION.read_text())
    missing = [path for path in config_fields() if path not in listed and path not in UNDOCUMENTED_FIELDS]
    assert missing == [], f"fields of lakestream/config.py not in docs/configuration.md's reference: {missing}"
    unknown = sorted(listed - set(config_fields()))
    assert unknown == [], f"docs/configuration.md lists fields lakestream/config.py does not have: {unknown}"


def test_readme_stays_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; reference belongs in docs/"
    head = "\n".join(lines[:6])
    assert "make demo" in head and "make test" in head, "the README's first lines give `make demo` and `make test`"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """A broken link, a missing heading and an undocumented field are each caught."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Rules → alerts\n\n```\n## not a heading\n```\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/page.md#rules--alerts) [gone](docs/missing.md) [bad](docs/page.md#nowhere)"
        " [code](docs/page.md#not-a-heading) [web](https://example.com/x.md) [self](#nowhere)\n"
    )
    assert broken_links(readme) == [
        "docs/missing.md: no such file",
        "docs/page.md#nowhere: docs/page.md has no heading #nowhere",
        "docs/page.md#not-a-heading: docs/page.md has no heading #not-a-heading",
        "#nowhere: README.md has no heading #nowhere",
    ]
    page = (
        f"# C\n\n{REFERENCE_HEADING}\n\n### {TOP_LEVEL}\n\n| field |\n|---|\n| `name` | x |\n\n"
        "### `kafka`\n\n| `group_id` | x |\n\n## After\n\n### `engine`\n\n| `idle_poll_s` | x |\n"
    )
    assert reference_fields(page) == {"name", "kafka.group_id"}


@pytest.mark.parametrize("path", ["kafka.schema_registry.url", "maintenance.policies.compaction.max_rows_per_file"])
def test_the_walk_reaches_nested_models(path: str) -> None:
    assert path in config_fields()
