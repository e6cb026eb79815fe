"""Runs kjit_bench_remote against real redis-servers on 127.0.0.1 (one served, one stopped with
SIGSTOP, and a closed port), and prints its table.

    python3 bench/bench_remote.py --build build [--json out.json]
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(folder):
    port = free_port()
    server = subprocess.Popen([os.environ.get("REDIS_SERVER", shutil.which("redis-server") or "redis-server"),
                               "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                               "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return server, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kjit-bench-redis-"))
    served, port = start(folder)
    hung, hung_port = start(folder)
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        command = [str(Path(args.build) / "bench" / "kjit_bench_remote"), str(ROOT / "kernels_src/activation/activation.cu"),
                   f"redis://127.0.0.1:{port}", f"redis://127.0.0.1:{hung_port}?timeout_ms=100",
                   f"redis://127.0.0.1:{free_port()}"]
        if args.json:
            command += ["--json", args.json]
        sys.exit(subprocess.run(command).returncode)
    finally:
        os.kill(hung.pid, signal.SIGCONT)
        for server in (served, hung):
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
