"""The README's Python quickstart runs as written (on a GPU); its manifest examples are the test
package's, which the tests run."""

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


def test_the_real_op_examples_are_the_test_package_s():
    text = README.read_text()
    section = text[text.index("### Ops that real kernels need") :]
    section = section[: section.index("\n## ")]
    section, tuning = section.split("#### Autotuning")
    blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    manifest = (README.parent / "tests" / "packages" / "optest" / "kernel.toml").read_text()
    assert len(blocks) == 4
    for block in blocks:
        assert block in manifest, block.splitlines()[0]
    # The autotuning example is the tuned test package's scale op.
    (block,) = re.findall(r"```toml\n(.*?)```", tuning, re.S)
    assert block in (README.parent / "tests" / "packages" / "tuned" / "kernel.toml").read_text()
