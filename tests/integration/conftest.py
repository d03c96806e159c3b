from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int, *args: str) -> subprocess.Popen[bytes]:
    """A real redis-server on 127.0.0.1:`port` (extra server arguments `args`), once it answers PING."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (the README's test command installs it)")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *args],
                            stdout=subprocess.DEVNULL)
    deadline = time.time() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server on a free loopback port, stopped by PID at the end."""
    port = _free_port()
    proc = start_redis(port, "--appendonly", "no")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
