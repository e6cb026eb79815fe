"""The README's Python quickstart runs as written (on a GPU)."""

import re
from pathlib import Path

from conftest import cuda

README = Path(__file__).resolve().parents[2] / "README.md"


def python_quickstart() -> str:
    text = README.read_text()
    section = text[text.index("## Python quickstart") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quickstart_is_valid_python():
    compile(python_quickstart(), "README.md", "exec")


@cuda
def test_quickstart_runs():
    namespace = {}
    exec(compile(python_quickstart(), "README.md", "exec"), namespace)
    assert namespace["gray"].shape == (1080, 1920)
    assert namespace["y"].shape == (8, 128)
