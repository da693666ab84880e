"""The README's "From Python" examples run as printed."""

import contextlib
import io
import pathlib
import re


def test_readme_example_runs():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    example, sweep_example, model_example = re.findall(r"```python\n(.*?)```", section, re.S)
    printed = io.StringIO()
    names = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "README.md", "exec"), names)
    assert printed.getvalue() == "[0 1 2 3 0 1 2 3] 4.0\n"
    # The sweep example continues the first (it uses its `pk`).
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(sweep_example, "README.md", "exec"), names)
    assert printed.getvalue() == "True []\n"
    # The model example, on its own.
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(model_example, "README.md", "exec"), {})
    assert printed.getvalue() == "(1, 64, 512) 20\n"
