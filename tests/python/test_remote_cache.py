"""The fleet tier (Note [Remote tier]) against a real redis-server on 127.0.0.1 and a free port:
one compile per kernel fleet-wide, and a server that is dead, hung, slow, paused, full, poisoned
or read-only costs no kernel."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

KERNELS = 6
REDIS = shutil.which("redis-server")
# CI installs redis-server; elsewhere (a GPU image without it) these tests say why they skip.
pytestmark = [pytest.mark.skipif(REDIS is None and not os.environ.get("CI"),
                                 reason="redis-server is not installed"),
              pytest.mark.torch_independent]  # the C++ tier, through kjit._C


class Redis:
    def __init__(self, folder: Path, *extra: str, port: int = 0):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart on the same port
            s.bind(("127.0.0.1", port))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(folder), "--enable-debug-command", "local", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.cmd("PING") == "PONG":
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def url(self, **params):
        query = "&".join(f"{k}={v}" for k, v in {"timeout_ms": 300, "connect_timeout_ms": 100, **params}.items())
        return f"redis://127.0.0.1:{self.port}?{query}"

    def cmd(self, *args, user=None):
        """One command over RESP; returns the decoded reply (bytes for bulk strings)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            if user:
                s.sendall(self._encode(["AUTH", *user]))
                self._read(s.makefile("rb"))
            s.sendall(self._encode(args))
            return self._read(s.makefile("rb"))

    @staticmethod
    def _encode(args):
        out = [f"*{len(args)}\r\n".encode()]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += [f"${len(a)}\r\n".encode(), a, b"\r\n"]
        return b"".join(out)

    def _read(self, f):
        line = f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2]
        if kind == b"*":
            return [self._read(f) for _ in range(int(rest))]
        raise ValueError(line)

    def entries(self):
        return sorted(k for k in self.cmd("KEYS", "kjit:v1:*") if b":lock:" not in k)

    def stop(self):
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def redis(tmp_path):
    server = Redis(tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """Six kernels, each of its own source (so six cache keys), each worth a real compile."""
    folder = tmp_path_factory.mktemp("fleetpkg") / "fleetpkg"
    folder.mkdir()
    manifest = ['[package]\nname = "fleetpkg"\nversion = "1.0.0"\n']
    for i in range(KERNELS):
        (folder / f"k{i}.cu").write_text(
            "#include <cuda_fp16.h>\n"
            f'extern "C" __global__ void k{i}(__half* x, int n) {{\n'
            f"  int j = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  if (j < n) x[j] = __hadd(x[j], __float2half({i}.0f));\n}}\n")
        manifest.append(f'[kernel.k{i}]\nsource = "k{i}.cu"\nentry = "k{i}"\n')
        manifest.append(
            f'[op.k{i}]\nschema = "k{i}(Tensor x) -> Tensor"\nkernel = "k{i}"\n'
            'outputs = [{ like = "x" }]\nargs = ["out0", "x.numel()"]\nblock = [256]\n'
            'grid = ["cdiv(x.numel(), 256)"]\n')
    (folder / "kernel.toml").write_text("\n".join(manifest))
    return folder


def warm(package, cache, remote=None, jobs=4, env=None, **popen):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KJIT_REMOTE")}
    environment.update(KJIT_CACHE_DIR=str(cache), KJIT_PATH=str(package.parent), **(env or {}))
    if remote:
        environment["KJIT_REMOTE_CACHE"] = remote
    command = [sys.executable, "-m", "kjit", "warm", "fleetpkg", "--arch", "sm_90", "-j", str(jobs)]
    if popen:
        return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, **popen)
    start = time.monotonic()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    result.elapsed = time.monotonic() - start
    return result


def summary(output):
    line = [l for l in output.splitlines() if " compiled, " in l][-1]
    compiled, cached, failed = (int(line.split(" compiled")[0].split()[-1]),
                                int(line.split(" already cached")[0].split()[-1]),
                                int(line.split(" failed")[0].split()[-1]))
    return compiled, cached, failed


def stats(cache):
    out = subprocess.run([sys.executable, "-m", "kjit", "cache", "stats", "--json"], capture_output=True,
                         text=True, env=dict(os.environ, KJIT_CACHE_DIR=str(cache)), check=True).stdout
    return json.loads(out)["stats"]


def local_keys(cache):
    out = subprocess.run([sys.executable, "-m", "kjit", "cache", "ls", "--json"], capture_output=True,
                         text=True, env=dict(os.environ, KJIT_CACHE_DIR=str(cache)), check=True).stdout
    return sorted(e["key"] for e in json.loads(out))


def test_eight_hosts_of_four_jobs_compile_each_kernel_once_fleet_wide(redis, package, tmp_path):
    hosts = [warm(package, tmp_path / f"host{i}", redis.url(), jobs=4, start_new_session=True)
             for i in range(8)]
    outputs = [h.communicate(timeout=300)[0] for h in hosts]
    results = [summary(o) for o in outputs]
    assert all(h.returncode == 0 for h in hosts), outputs
    assert sum(c for c, _, _ in results) == KERNELS, results  # NVRTC ran six times in the fleet
    assert all(c + k == KERNELS and f == 0 for c, k, f in results), results
    assert len(redis.entries()) == KERNELS
    keys = [local_keys(tmp_path / f"host{i}") for i in range(8)]
    assert all(k == keys[0] for k in keys) and len(keys[0]) == KERNELS
    for i in range(8):  # every host's binaries pass their checksums
        subprocess.run([sys.executable, "-m", "kjit", "cache", "verify"], check=True,
                       env=dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / f"host{i}")), capture_output=True)
    remote = [stats(tmp_path / f"host{i}")["remote"] for i in range(8)]
    assert sum(r["hits"] for r in remote) == 8 * KERNELS - KERNELS
    assert sum(r["writes"] for r in remote) == KERNELS


def test_a_remote_hit_goes_to_the_local_store_and_a_local_hit_never_asks(redis, package, tmp_path):
    assert summary(warm(package, tmp_path / "a", redis.url()).stdout)[0] == KERNELS
    b = warm(package, tmp_path / "b", redis.url())
    assert summary(b.stdout) == (0, KERNELS, 0)
    assert stats(tmp_path / "b")["remote"]["hits"] == KERNELS
    redis.stop()  # the local store has everything now: a dead remote is not even asked
    again = warm(package, tmp_path / "b", redis.url())
    assert summary(again.stdout) == (0, KERNELS, 0)
    assert "unavailable" not in again.stdout + again.stderr


def baseline(package, tmp_path):
    return warm(package, tmp_path / "baseline", jobs=1).elapsed


@pytest.mark.parametrize("fault", ["down", "killed", "hung", "slow", "paused", "full"])
def test_a_faulty_server_costs_no_kernel_and_at_most_its_timeouts(redis, package, tmp_path, fault):
    if fault == "full":
        redis.cmd("CONFIG", "SET", "maxmemory", "1mb")
        redis.cmd("CONFIG", "SET", "maxmemory-policy", "noeviction")
        redis.cmd("SET", "filler", "x" * 900_000)
    alone = baseline(package, tmp_path)
    url = redis.url()
    background = None
    if fault == "down":
        redis.stop()
    elif fault == "hung":
        os.kill(redis.process.pid, signal.SIGSTOP)
    elif fault == "slow":
        background = subprocess.Popen([sys.executable, "-c", f"""
import socket
s = socket.create_connection(("127.0.0.1", {redis.port}))
s.sendall(b"*3\\r\\n$5\\r\\nDEBUG\\r\\n$5\\r\\nSLEEP\\r\\n$1\\r\\n4\\r\\n"); s.recv(10)"""])
        time.sleep(0.2)
    elif fault == "paused":
        redis.cmd("CLIENT", "PAUSE", "4000", "WRITE")
    if fault == "killed":
        host = warm(package, tmp_path / "host", url, jobs=1, start_new_session=True)
        output = ""
        while True:
            line = host.stdout.readline()
            output += line
            if not line or line.startswith("[1/"):
                break
        redis.process.kill()
        output += host.stdout.read()
        host.wait(timeout=300)
        result = subprocess.CompletedProcess(host.args, host.returncode, output, "")
        result.elapsed = 0
    else:
        result = warm(package, tmp_path / "host", url, jobs=1)
    if background:
        background.wait(timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary(result.stdout) == (KERNELS, 0, 0)
    assert local_keys(tmp_path / "host") == local_keys(tmp_path / "baseline")
    if fault != "killed":
        # One timeout (0.3 s, then the breaker is open) per operation that was in flight, a few
        # at most, plus the exit's flush deadline for queued writes (2 s).
        assert result.elapsed < alone + 4, (result.elapsed, alone)
    text = result.stdout + result.stderr
    if fault in ("down", "hung", "slow"):
        assert text.count("is unavailable") <= 2, text  # one warning per state change (per process)
    if fault == "full":
        assert stats(tmp_path / "host")["remote"]["errors"] >= 1


def test_bad_entries_are_deleted_and_recompiled(redis, package, tmp_path):
    assert summary(warm(package, tmp_path / "a", redis.url()).stdout)[0] == KERNELS
    names = redis.entries()
    good = redis.cmd("GET", names[3])
    redis.cmd("SET", names[0], b"garbage")
    redis.cmd("SET", names[1], good[:-10])   # truncated
    redis.cmd("SET", names[2], good)         # another key's entry
    flipped = bytearray(redis.cmd("GET", names[4]))
    flipped[len(flipped) // 2] ^= 0xFF       # a flipped bit in the binary
    redis.cmd("SET", names[4], bytes(flipped))
    b = warm(package, tmp_path / "b", redis.url())
    assert summary(b.stdout) == (4, 2, 0), b.stdout + b.stderr
    assert stats(tmp_path / "b")["remote"]["bad_entries"] == 4
    assert len(redis.entries()) == KERNELS  # replaced by good ones
    assert summary(warm(package, tmp_path / "c", redis.url()).stdout) == (0, KERNELS, 0)


def test_a_fleet_secret_signs_entries_and_refuses_unsigned_or_foreign_ones(redis, package, tmp_path):
    secret = tmp_path / "fleet.key"
    secret.write_text("a fleet secret of some length\n")
    other = tmp_path / "other.key"
    other.write_text("another fleet's secret, also long\n")
    assert summary(warm(package, tmp_path / "unsigned", redis.url()).stdout)[0] == KERNELS
    signed = warm(package, tmp_path / "signed", redis.url(), env={"KJIT_REMOTE_CACHE_KEY_FILE": str(secret)})
    assert summary(signed.stdout) == (KERNELS, 0, 0)  # unsigned entries refused, replaced
    assert stats(tmp_path / "signed")["remote"]["bad_entries"] == KERNELS
    same = warm(package, tmp_path / "same", redis.url(), env={"KJIT_REMOTE_CACHE_KEY_FILE": str(secret)})
    assert summary(same.stdout) == (0, KERNELS, 0)
    foreign = warm(package, tmp_path / "foreign", redis.url(), env={"KJIT_REMOTE_CACHE_KEY_FILE": str(other)})
    assert summary(foreign.stdout) == (KERNELS, 0, 0)
    assert "wrong signature" in foreign.stdout + foreign.stderr


def test_a_killed_lock_holder_delays_the_others_only_until_its_ttl(redis, package, tmp_path):
    url = redis.url(lock_ttl_ms=3000)
    holder = warm(package, tmp_path / "holder", url, jobs=1, start_new_session=True)
    deadline = time.monotonic() + 60
    while not redis.cmd("KEYS", "kjit:v1:lock:*") and time.monotonic() < deadline:
        time.sleep(0.005)
    assert redis.cmd("KEYS", "kjit:v1:lock:*"), "the holder never took a lock"
    os.killpg(holder.pid, signal.SIGKILL)  # mid-compile, with its lock
    holder.wait(timeout=30)
    assert redis.cmd("KEYS", "kjit:v1:lock:*")
    other = warm(package, tmp_path / "other", url, jobs=1)
    assert other.returncode == 0, other.stdout + other.stderr
    assert summary(other.stdout)[2] == 0
    assert other.elapsed < 3 + 30  # the TTL, then its own compiles
    assert stats(tmp_path / "other")["remote"]["lock_waits"] >= 1


def test_read_only_clients_and_users_without_write_rights_write_nothing(redis, package, tmp_path):
    ro = warm(package, tmp_path / "ro", redis.url(mode="ro"))
    assert summary(ro.stdout) == (KERNELS, 0, 0)
    assert redis.cmd("DBSIZE") == 0
    assert redis.cmd("ACL", "SETUSER", "reader", "on", ">reader-password", "~*", "+@read", "+@connection") == "OK"
    url = f"redis://reader:reader-password@127.0.0.1:{redis.port}?timeout_ms=300"
    user = warm(package, tmp_path / "user", url)
    assert user.returncode == 0 and summary(user.stdout) == (KERNELS, 0, 0), user.stdout + user.stderr
    assert redis.cmd("DBSIZE") == 0
    assert stats(tmp_path / "user")["remote"]["writes"] == 0


def test_push_pull_and_stats(redis, package, tmp_path):
    assert summary(warm(package, tmp_path / "a").stdout)[0] == KERNELS  # local only
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "a"), KJIT_REMOTE_CACHE=redis.url())
    pushed = subprocess.run([sys.executable, "-m", "kjit", "cache", "push"], env=env, capture_output=True, text=True)
    assert pushed.returncode == 0 and f"pushed {KERNELS} entries" in pushed.stdout, pushed.stderr
    env["KJIT_CACHE_DIR"] = str(tmp_path / "b")
    good = redis.cmd("GET", redis.entries()[0])
    redis.cmd("SET", "kjit:v1:../../x", good)  # names that are no cache key are not pulled
    redis.cmd("SET", "kjit:v1:" + "0" * 32, b"garbage")  # a key name with a bad entry: refused
    pulled = subprocess.run([sys.executable, "-m", "kjit", "cache", "pull"], env=env, capture_output=True, text=True)
    assert pulled.returncode == 0 and f"pulled {KERNELS} entries" in pulled.stdout, pulled.stderr
    assert local_keys(tmp_path / "b") == local_keys(tmp_path / "a")
    text = subprocess.run([sys.executable, "-m", "kjit", "cache", "stats"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert "remote hits" in text and f"redis://127.0.0.1:{redis.port}" in text
    bad = subprocess.run([sys.executable, "-m", "kjit", "cache", "pull", "--remote", "http://nope"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "must start with redis://" in bad.stderr


def test_a_long_running_process_reconnects_when_the_server_comes_back(tmp_path):
    """Note [Breaker]: open after the failure, half-open after the back-off (1 s), closed again."""
    server = Redis(tmp_path)
    port = server.port
    script = f"""
import os, socket, subprocess, sys, time
import kjit
def compile(i):
    return kjit.RawKernel('extern "C" __global__ void k(int* x) {{ *x = %d; }}' % i, "k").compile("sm_90")
compile(1)
print("first", flush=True)
sys.stdin.readline()          # the server is gone now
compile(2)                    # fails over to a local compile, opens the breaker
print("second", flush=True)
sys.stdin.readline()          # the server is back
time.sleep(1.5)               # past the back-off
compile(3)
kjit._C.flush_remote()
print("third", flush=True)
"""
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"),
               KJIT_REMOTE_CACHE=f"redis://127.0.0.1:{port}?timeout_ms=300&connect_timeout_ms=100")
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout.readline().strip() == "first"
        time.sleep(0.3)  # the first entry is written by the writer thread
        assert len(server.entries()) == 1
        server.stop()
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "second"
        server = Redis(tmp_path, port=port)
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "third"
        assert process.wait(timeout=60) == 0
        stderr = process.stderr.read()
        assert "is unavailable" in stderr and "is reachable again" in stderr, stderr
        assert len(server.entries()) == 1  # the third kernel, written after reconnecting
    finally:
        if process.poll() is None:
            process.kill()
        server.stop()
