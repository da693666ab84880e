"""Every ```python block of README.md and docs/*.md runs as printed (scripts/test-docs says which
info strings mean what): the blocks of one page in order, in one namespace, and where a page states
what a block prints, it prints that."""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

# What the pages say their blocks print: (page, index of the block among the page's run blocks).
PRINTS = {
    ("README.md", 0): "[0 1 2 3 0 1 2 3] 4.0\n",
    ("README.md", 1): "True ['passed', 'passed']\n",
    ("docs/PYTHON.md", 0): "[0 1 2 3 0 1 2 3] 4.0\n",
    ("docs/PYTHON.md", 1): "True []\n",
    ("docs/PYTHON.md", 2): "(1, 64, 512) 20\n",
    ("docs/CONFORMANCE.md", 0): "True ['passed', 'passed']\n",
}


def python_blocks(page):
    # Only ```python exactly: ```python no-run blocks are illustrations.
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run_as_printed(page):
    rel = page.relative_to(ROOT).as_posix()
    names = {}
    for k, block in enumerate(python_blocks(page)):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{rel} python block {k + 1}", "exec"), names)
        if (rel, k) in PRINTS:
            assert printed.getvalue() == PRINTS[(rel, k)], f"{rel} python block {k + 1}"


def test_every_stated_output_has_its_block():
    for rel, k in PRINTS:
        assert len(python_blocks(ROOT / rel)) > k, f"{rel} lost its python block {k + 1}"
