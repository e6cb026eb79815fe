"""The `kjit` command installed with the Python package: runs the bundled C++ tool."""

import os
import sys
from pathlib import Path


def executable() -> Path:
    return Path(__file__).resolve().parent / "bin" / "kjit"


def main() -> None:
    exe = executable()
    if not exe.is_file():
        sys.exit(f"kjit: the command-line tool is missing from this installation ({exe})")
    os.execv(exe, [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
