"""The README's "From Python" example runs as printed."""

import contextlib
import io
import pathlib
import re


def test_readme_example_runs():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "README.md", "exec"), {})
    assert printed.getvalue() == "[0 1 2 3 0 1 2 3] 4.0\n"
