"""The HTTP protocol `hybridsearch serve` runs: Nagle's algorithm off on every connection, also on
a listening socket made as uvicorn makes one for several workers (family only, no protocol named),
where asyncio leaves it on and each response waits about 40 ms for the client's delayed ACK."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from query_service.http import NoDelayH11


async def _app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _nodelay_of_a_served_connection(protocol: type, monkeypatch) -> int:
    seen: list[int] = []
    made = H11Protocol.connection_made

    def record(self, transport) -> None:  # runs inside NoDelayH11's, after its own setting
        made(self, transport)
        seen.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(H11Protocol, "connection_made", record)
    sock = socket.socket(family=socket.AF_INET)  # as uvicorn's Config.bind_socket: proto 0, not IPPROTO_TCP
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app, http=protocol, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 30
        while not server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text == "ok"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    assert len(seen) == 1
    return seen[0]


def test_connections_of_a_shared_listening_socket_have_nagle_off(monkeypatch) -> None:
    assert _nodelay_of_a_served_connection(NoDelayH11, monkeypatch) != 0


def test_plain_h11_on_such_a_socket_leaves_nagle_on(monkeypatch) -> None:
    """The condition the protocol is there for: without it the option stays off."""
    if _nodelay_of_a_served_connection(H11Protocol, monkeypatch) != 0:
        pytest.fail("asyncio now sets TCP_NODELAY on these sockets itself; NoDelayH11 can go")
