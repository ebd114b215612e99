"""The README and docs/ link to pages and headings that exist."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCED = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$", re.M)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in HEADING.finditer(FENCED.sub("", page.read_text()))}


def broken_links(page: Path) -> list[str]:
    broken = []
    for m in LINK.finditer(FENCED.sub("", page.read_text())):
        link = m.group(1)
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{link}: no such heading")
    return broken


def test_the_docs_exist():
    assert len(PAGES) > 10
    assert len(PAGES[0].read_text().splitlines()) <= 260


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path):
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path):
    (tmp_path / "a.md").write_text("# Title\n[ok](#title) [gone](b.md) [no](#nope)\n")
    assert broken_links(tmp_path / "a.md") == ["b.md: no such file", "#nope: no such heading"]


def test_the_timm_recipe_resumes_from_the_folder_timm_writes():
    """Issue 32: the timm recipe had no fixed `--experiment`, so timm wrote into a folder
    named after the start time and `resume_args` could not name its `last.pth.tar`."""
    text = (ROOT / "docs" / "how-to" / "continue-interrupted-trials.md").read_text()
    block = text.split("**timm's `train.py`**")[1].split("```yaml")[1].split("```")[0]
    trainer = yaml.safe_load(textwrap.dedent(block))["trainer"]
    args = trainer["args"]
    folder = f"{args[args.index('--output') + 1]}/{args[args.index('--experiment') + 1]}"
    assert trainer["resume_args"] == ["--resume", f"{folder}/last.pth.tar"]
    assert folder.startswith("{checkpoint_dir}/")
