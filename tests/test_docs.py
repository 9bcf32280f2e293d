"""The documents as a product: every image in ``docs/`` is shown by a document, every image or
file a document links to exists (and so does the heading an anchor names), and no document,
README or experiment file carries a lab-notebook phrase (history goes to CHANGELOG.md). The
checks are plain functions of a folder, so the last tests plant bad documents in a temporary
tree and see each check fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Phrases of a lab notebook; CHANGELOG.md is where such notes belong, so it is not searched.
NOTEBOOK_PHRASES = ("not adopted", "tried, not", "was tried")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def documents(root: Path) -> list[Path]:
    """The documents that may show images: ``docs/*.md`` and ``README.md``."""
    return sorted((root / "docs").glob("*.md")) + [root / "README.md"]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def unreferenced_images(root: Path) -> list[str]:
    """Images in ``docs/`` that no document links to."""
    linked = {(doc.parent / target).resolve()
              for doc in documents(root) for target in LINK.findall(doc.read_text())}
    return [png.name for png in sorted((root / "docs").glob("*.png"))
            if png.resolve() not in linked]


def broken_links(root: Path) -> list[str]:
    """``document: target`` for every relative link whose file, or whose anchor's heading, is
    missing."""
    broken = []
    for doc in documents(root):
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: outside the repository
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.is_file():
                broken.append(f"{doc.name}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.MULTILINE)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{doc.name}: {target}")
    return broken


def notebook_phrases(root: Path) -> list[str]:
    """``file: phrase`` for each lab-notebook phrase in the documents and experiment files."""
    files = documents(root) + sorted((root / "harness" / "conf").rglob("*.yaml"))
    return [f"{file.relative_to(root)}: {phrase}" for file in files
            for phrase in NOTEBOOK_PHRASES if phrase in file.read_text().lower()]


def test_every_image_in_docs_is_shown_by_a_document():
    assert unreferenced_images(ROOT) == []


def test_every_linked_file_and_anchor_exists():
    assert broken_links(ROOT) == []


def test_no_lab_notebook_phrases_outside_the_changelog():
    assert notebook_phrases(ROOT) == []


def test_slug_follows_github():
    assert (slug("The same numbers on another machine: `HARNESS_KERNELS=portable`")
            == "the-same-numbers-on-another-machine-harness_kernelsportable")
    assert slug("Curriculum ablations") == "curriculum-ablations"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository with one document that shows one image and links a heading."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "harness" / "conf").mkdir(parents=True)
    (tmp_path / "docs" / "shown.png").write_bytes(b"png")
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Two words\n\n![x](shown.png)\n")
    (tmp_path / "README.md").write_text("[a](docs/a.md#two-words)\n")
    return tmp_path


def test_the_checks_pass_on_a_clean_tree(tree: Path):
    assert (unreferenced_images(tree), broken_links(tree), notebook_phrases(tree)) == ([], [], [])


def test_an_image_nobody_shows_is_named(tree: Path):
    (tree / "docs" / "orphan.png").write_bytes(b"png")
    assert unreferenced_images(tree) == ["orphan.png"]


def test_a_missing_image_file_or_heading_is_named(tree: Path):
    (tree / "docs" / "b.md").write_text(
        "![gone](gone.png) [c](c.md) [h](a.md#no-such-heading) [web](https://example.org)\n")
    assert broken_links(tree) == ["b.md: gone.png", "b.md: c.md", "b.md: a.md#no-such-heading"]


def test_a_notebook_phrase_is_named(tree: Path):
    (tree / "harness" / "conf" / "x.yaml").write_text("# lr 3e-3 was tried\nlr: 1\n")
    assert notebook_phrases(tree) == ["harness/conf/x.yaml: was tried"]
