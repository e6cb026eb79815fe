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


def test_the_shipped_kernels_table_is_the_packages_manifests():
    """Each package row of "Shipped kernels" gives its manifest's version and names every op of
    it (a backward may be named by the pattern `*_backward(...)`), and each signature it writes out
    is the manifest's schema, to the character (the arguments alone where no return is written)."""
    import tomllib

    text = README.read_text()
    section = text[text.index("### Shipped kernels") :]
    rows = re.findall(r"^\| `(\w+)` \| ([\d.]+) \| (.*) \|$", section, re.M)
    packages = README.parent / "kernels_src"
    assert sorted(name for name, _, _ in rows) == sorted(p.parent.name for p in packages.glob("*/kernel.toml"))
    for name, version, ops in rows:
        manifest = tomllib.loads((packages / name / "kernel.toml").read_text())
        assert version == manifest["package"]["version"], name
        schemas = {op: spec["schema"] for op, spec in manifest["op"].items()}
        named, patterns = set(), set()
        for item in re.findall(r"`([^`]+)`", ops):
            call = re.fullmatch(r"(\*?)(\w+)(?:\((.*?)\)(?: -> (.*))?)?", item)
            if call is None:
                continue  # not an op: an argument value, a mode
            star, op, args, returns = call.groups()
            if star:
                patterns.add(op)
                continue
            assert op in schemas or args is None, f"{name}: the README writes out {op}, not an op of it"
            if op not in schemas:
                continue
            named.add(op)
            if returns is not None:
                assert f"{op}({args}) -> {returns}" == schemas[op], f"{name}: {op}"
            elif args is not None:
                assert schemas[op].startswith(f"{op}({args}) -> "), f"{name}: {op}"
        for op in schemas:
            assert op in named or any(op.endswith(p) and op.removesuffix(p) in schemas for p in patterns), \
                f"{name}: the README does not name {op}"
