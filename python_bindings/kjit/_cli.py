"""The `kjit` command installed with the Python package.

Distribution commands run here (fetch, lock, sync, bundle, wheel, versions, info NAME) and tune
(it times kernels through torch); everything else
runs the bundled C++ tool (warm, cache, info, compile, new). Exit codes: 0 success, 1 failure,
2 usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

PYTHON_COMMANDS = {"fetch", "lock", "sync", "bundle", "wheel", "versions", "tune"}


def executable() -> Path:
    return Path(__file__).resolve().parent / "bin" / "kjit"


class _Parser(argparse.ArgumentParser):
    """argparse with the C++ half's help and error style (CLI11's), so that every `kjit COMMAND
    --help` reads alike: a description, `Usage: kjit COMMAND [OPTIONS] ARGS`, then Positionals
    and Options in two columns; a usage error is one line and exits 2."""

    def format_help(self) -> str:
        positionals = [a for a in self._actions if not a.option_strings and a.dest != "command"]
        options = [a for a in self._actions if a.option_strings]

        def row(name: str, text: str | None) -> str:
            return f"  {name:<28}{' ' if len(name) >= 28 else ''}{text or ''}".rstrip() + "\n"

        def shown(action: argparse.Action) -> str:
            if not action.option_strings:
                return action.dest + " TEXT"
            names = ",".join(action.option_strings)
            return names if action.nargs == 0 else f"{names} TEXT"

        args = " ".join(a.dest if a.nargs != "?" else f"[{a.dest}]" for a in positionals)
        text = (self.description + "\n" if self.description else "") + f"Usage: {self.prog} [OPTIONS] {args}".rstrip() + "\n"
        if positionals:
            text += "\nPositionals:\n" + "".join(row(shown(a), a.help) for a in positionals)
        text += "\nOptions:\n" + "".join(
            row(shown(a), "Print this help message and exit" if isinstance(a, argparse._HelpAction) else a.help) for a in options)
        return text

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\nRun with --help for more information.\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kjit", description="kernel package distribution")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=description, description=description)

    fetch = command("fetch", "fetch a package from a git repository into the package store")
    fetch.add_argument("url", help="the git repository (https://, ssh://, git@host:path or a local path)")
    fetch.add_argument("--version", help="a range (>=1.1,<2, ^1.2, ~=1.4, 1.1.2) or a commit hash")
    lock = command("lock", "resolve [tool.kjit.dependencies] of pyproject.toml into kjit.lock")
    lock.add_argument("project", nargs="?", default=".", help="the project folder (default: here)")
    sync = command("sync", "fetch and verify what kjit.lock names, so load_locked works here (and offline)")
    sync.add_argument("--lock", help="the lock file (default: kjit.lock here or above)")
    bundle = command("bundle", "copy the locked packages and a pre-warmed store into a folder")
    bundle.add_argument("out", help="the folder to write")
    bundle.add_argument("--arch", help="archs to pre-warm, e.g. sm_80,sm_90")
    bundle.add_argument("--lock", help="the lock file (default: kjit.lock here or above)")
    wheel = command("wheel", "build a py3-none-any wheel of a kernel package")
    wheel.add_argument("package", help="a package name or folder")
    wheel.add_argument("-o", "--out", default="dist", help="the folder to write the wheel to (default: dist)")
    wheel.add_argument("--arch", help="also ship a store pre-warmed for these archs")
    versions = command("versions", "the installed versions of a package")
    versions.add_argument("name", help="a package name")
    versions.add_argument("--json", action="store_true", help="print JSON")
    info = command("info", "a package: version, ops with schemas, kernels, source hash")
    info.add_argument("name", help="a package name")
    info.add_argument("--version", help="a version or range (default: the highest installed)")
    info.add_argument("--json", action="store_true", help="print JSON")
    tune = command("tune", "tune ops' launch parameters for shapes on this GPU, into the store")
    tune.add_argument("package", help="a package name or folder")
    tune.add_argument("--op", action="append", help="an op to tune (repeatable; default: every op with tune parameters)")
    tune.add_argument("--shape", action="append", required=True, type=_tune_shape,
                      help="one call's tensors, NAME=DIMS[:DTYPE],... e.g. x=8x4096,weight=4096 (repeatable)")
    tune.add_argument("--arg", action="append", default=[], type=_tune_arg,
                      help="a non-tensor argument NAME=VALUE (default: the schema's)")
    tune.add_argument("--dtype", default="float32", help="the dtype of tensors given without one (default: float32)")
    tune.add_argument("--budget", type=float, help="seconds of tuning per bucket at most (KJIT_TUNE_BUDGET; default 30)")
    tune.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _tune_shape(text: str) -> dict[str, tuple[list[int], str | None]]:
    """'x=8x4096:bfloat16,weight=4096' -> {'x': ([8, 4096], 'bfloat16'), 'weight': ([4096], None)}."""
    tensors = {}
    for item in text.split(","):
        name, sep, spec = item.strip().partition("=")
        dims, _, dtype = spec.partition(":")
        try:
            shape = [int(d) for d in dims.split("x")] if dims else []
        except ValueError:
            shape = None
        if not sep or not name.isidentifier() or shape is None or any(d < 0 for d in shape):
            raise argparse.ArgumentTypeError(f"'{text}' is not NAME=DIMS[:DTYPE],... (e.g. x=8x4096:bfloat16,weight=4096)")
        tensors[name] = (shape, dtype or None)
    return tensors


def _tune_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=VALUE")
    return name, value


def _run_python(argv: list[str]) -> int:
    args = _parser().parse_args(argv)  # exits 2 on usage errors
    import warnings

    # A warning is one line, as the C++ half writes them (not Python's file:line: UserWarning).
    warnings.showwarning = lambda message, *_: print(f"kjit: warning: {message}", file=sys.stderr)
    if args.command == "tune":
        from kjit import _tune_command  # torch: it times kernels through the ops

        return _tune_command.run(args)
    from kjit import _locking, _packages  # not torch (Note [Lazy kjit]): these commands never need it

    if args.command == "fetch":
        candidate = _packages.fetch(args.url, args.version)
        source = json.loads((candidate.path / _packages.SOURCE_FILE).read_text()) if (candidate.path / _packages.SOURCE_FILE).is_file() else {}
        print(f"{candidate.name} {candidate.version} at {source.get('commit', '?')[:12]} -> {candidate.path}")
    elif args.command == "lock":
        path = _locking.lock(Path(args.project))
        data = json.loads(path.read_text())
        for name, entry in sorted(data["packages"].items()):
            print(f"{name} {entry['version']} ({entry['requested']}) {entry['hash'][:19]}")
        print(f"wrote {path}")
    elif args.command == "sync":
        lock_path = Path(args.lock) if args.lock else _locking.find_lock()
        for name, version, what, path in _locking.sync(lock_path):
            print(f"{name} {version}: {what} ({path})")
    elif args.command == "bundle":
        lock_path = Path(args.lock) if args.lock else _locking.find_lock()
        out = _locking.bundle(Path(args.out), args.arch, lock_path, executable())
        print(f"bundled {len(_locking.read_lock(out / 'kjit.lock')['packages'])} package(s) into {out}")
    elif args.command == "wheel":
        package = _packages.locate(args.package, None).path
        store = None
        if args.arch:
            import subprocess
            import tempfile

            tmp = Path(tempfile.mkdtemp(prefix="kjit-wheel-"))
            env = dict(os.environ, KJIT_CACHE_DIR=str(tmp / "cache"))
            for command in (["warm", str(package), "--arch", args.arch], ["cache", "export", str(tmp / "kernels.sqlite")]):
                if subprocess.run([str(executable()), *command], env=env).returncode != 0:
                    return 1
            store = tmp / "kernels.sqlite"
        wheel = _locking.build_wheel(package, Path(args.out), store)
        print(f"wrote {wheel}")
    elif args.command == "versions":
        if not _packages.candidates(args.name):
            print(f"kjit: no kernel package '{args.name}' is installed", file=sys.stderr)
            return 1
        found = sorted(_packages.candidates(args.name), key=lambda c: c.version)
        if args.json:
            print(json.dumps([{"version": str(c.version), "path": str(c.path), "origin": c.origin} for c in found], indent=2))
        for candidate in [] if args.json else found:
            print(f"{candidate.version}  {candidate.path} ({candidate.origin})")
    elif args.command == "info":
        candidate = _packages.locate(args.name, args.version)
        manifest = _packages.read_manifest(candidate.path)
        hashes = _locking.file_hashes(candidate.path)
        report = {
            "name": candidate.name,
            "version": str(candidate.version),
            "path": str(candidate.path),
            "namespace": _packages.namespace_for(candidate.name, candidate.version),
            "description": manifest.get("package", {}).get("description", ""),
            "ops": {name: op.get("schema", "") for name, op in manifest.get("op", {}).items()},
            "kernels": {name: k.get("entry", "") for name, k in manifest.get("kernel", {}).items()},
            "source_hash": _locking.content_hash(hashes),
        }
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(f"{report['name']} {report['version']}  ({report['path']})")
            print(f"  {report['description']}")
            print(f"  ops (torch.ops.{report['namespace']}):")
            for op, schema in report["ops"].items():
                print(f"    {schema}")
            print("  kernels: " + ", ".join(f"{k} = {e}" for k, e in report["kernels"].items()))
            print(f"  source hash: {report['source_hash']}")
    return 0


# The C++ commands whose other arguments are packages, and their options that take a value.
_PACKAGE_COMMANDS = {"warm", "check"}
_VALUE_OPTIONS = {"--arch", "--driver-version", "-j", "--jobs", "--remote"}


def _package_argv(argv: list[str]) -> list[str]:
    """`kjit warm` and `kjit check` with packages named as the Python API finds them (KJIT_PATH,
    the package store, the shipped ones, wheels' entry points: one registry for both halves),
    given to the C++ tool as folders. `warm` with no names: every installed package, the highest
    version of each, and the folders that do not load (the tool reports them and warms the
    rest)."""
    from kjit import _packages

    out, names, i = [argv[0]], [], 1
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUE_OPTIONS and i + 1 < len(argv):
            out += [arg, argv[i + 1]]
            i += 2
            continue
        (out if arg.startswith("-") else names).append(arg)
        i += 1
    if any(a in ("-h", "--help") for a in out):
        return argv
    folders = []
    if names:
        for name in names:
            folders.append(name if (Path(name) / "kernel.toml").is_file() or Path(name).name == "kernel.toml"
                           else str(_packages.resolve(name).path))
    elif argv[0] == "warm":
        found, broken = _packages.installed()
        # The broken ones too: the tool says why each does not load, warms the rest, exits 1.
        folders = [str(c.path) for c in found] + [str(path) for path, _ in broken]
    return out + folders


def _cache_why_argv(argv: list[str]) -> list[str]:
    """`kjit cache why PACKAGE [OP]` with the package found as kjit.load finds it."""
    from kjit import _packages

    if len(argv) < 3 or argv[2].startswith("-") or (Path(argv[2]) / "kernel.toml").is_file():
        return argv
    return [*argv[:2], str(_packages.resolve(argv[2]).path), *argv[3:]]


def _info_argv(argv: list[str]) -> list[str]:
    """`kjit info` lists the packages of the package store and of wheels too (the C++ tool sees
    only its search path)."""
    from kjit import _packages

    if any(a in ("-h", "--help") for a in argv):
        return argv
    found, broken = _packages.installed()
    extra: list[str] = []
    for path in [c.path for c in found] + [path for path, _ in broken]:
        extra += ["--package", str(path)]
    return argv + extra


def main() -> None:
    argv = sys.argv[1:]
    wants_python = bool(argv) and (
        argv[0] in PYTHON_COMMANDS or (argv[0] == "info" and any(not a.startswith("-") for a in argv[1:]))
    )
    if wants_python:
        from kjit._errors import Error

        try:
            sys.exit(_run_python(argv))
        except Error as e:
            print(f"kjit: {e}", file=sys.stderr)
            sys.exit(1)
    exe = executable()
    if not exe.is_file():
        sys.exit(f"kjit: the command-line tool is missing from this installation ({exe})")
    if argv and (argv[0] in _PACKAGE_COMMANDS or argv[:2] == ["cache", "why"] or argv[0] == "info"):
        from kjit._errors import Error

        try:
            argv = _package_argv(argv) if argv[0] in _PACKAGE_COMMANDS else _cache_why_argv(argv) if argv[0] == "cache" else _info_argv(argv)
        except Error as e:
            print(f"kjit: {e}", file=sys.stderr)
            sys.exit(1)
    os.environ["KJIT_PYTHON_CLI"] = "1"  # its --help lists the commands served here too
    os.execv(exe, [str(exe), *argv])


if __name__ == "__main__":
    main()
