"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    namespace: dict = {}
    for block in blocks:  # later blocks may use names from earlier ones, as a reader would
        exec(compile(block, str(README), "exec"), namespace)
