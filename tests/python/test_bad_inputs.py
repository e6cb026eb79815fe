"""Every input under tests/bad_inputs/ gets a typed error naming the problem (see its README)."""

from pathlib import Path

import pytest

import kjit

BAD = Path(__file__).resolve().parents[1] / "bad_inputs"
SOURCES = sorted(BAD.glob("sources/*.cu"))
MANIFESTS = sorted(p.parent for p in BAD.glob("manifests/*/kernel.toml"))


def test_the_corpus_is_there():
    assert len(SOURCES) >= 5 and len(MANIFESTS) >= 7


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_bad_sources_are_compile_errors(source):
    lines = source.read_text().splitlines()
    expect = lines[0].removeprefix("// expect: ")
    names = [l.removeprefix("// name: ") for l in lines[1:3] if l.startswith("// name: ")]
    name = names[0] if names else "k"
    kernel = kjit.RawKernel(source.read_text(), name, include_dirs=[source.parent], name_expressions=names)
    with pytest.raises(kjit.CompileError) as info:
        kernel.compile("sm_90")
    assert expect in info.value.log or expect in str(info.value), str(info.value)


@pytest.mark.parametrize("package", MANIFESTS, ids=lambda p: p.name)
def test_bad_manifests_are_manifest_errors(package):
    location, fragment = (package / "expect.txt").read_text().splitlines()[:2]
    with pytest.raises(kjit.ManifestError) as info:
        kjit.load(package)
    assert info.value.location == location, str(info.value)
    assert fragment in str(info.value)
    assert info.value.line > 0 or location == "(file)"
