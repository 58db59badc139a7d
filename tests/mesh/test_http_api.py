"""HTTP API server (h11 + Trio) and the sync client, over real sockets on 127.0.0.1."""

from __future__ import annotations

import errno
import functools
import http.client
import json
import logging
import socket
from typing import Any

import pytest
import trio

from mesh.http_api import (
    HttpError,
    Request,
    Response,
    Router,
    error_response,
    json_response,
    serve_http,
    text_response,
)
from mesh.http_client import HttpClientError, request_json


def make_router() -> Router:
    router = Router()

    async def echo(req: Request) -> Response:
        return json_response(
            {
                "method": req.method,
                "path": req.path,
                "query": req.query,
                "params": req.path_params,
                "body": req.body.decode(),
                "peer": req.peer,
                "ctype": req.headers.get("content-type"),
                "auth": req.headers.get("authorization"),
            }
        )

    async def config_get(req: Request) -> Response:
        return json_response({"key": req.path_params["key"]})

    async def config_put(req: Request) -> Response:
        value = req.json()
        return json_response({"key": req.path_params["key"], "value": value}, status=201)

    async def config_special(req: Request) -> Response:
        return json_response({"special": True})

    async def crash(req: Request) -> Response:
        raise RuntimeError("handler bug")

    async def teapot(req: Request) -> Response:
        raise HttpError(418, "short and stout", headers={"X-Why": "tea"})

    async def metrics(req: Request) -> Response:
        return text_response("up 1\n", content_type="text/plain; version=0.0.4")

    async def not_a_response(req: Request) -> Any:  # a buggy handler, as the type checker cannot see
        return {"oops": 1}

    router.add("GET", "/echo", echo)
    router.add("POST", "/echo", echo)
    router.add("GET", "/api/v1/config/{key}", config_get)
    router.add("PUT", "/api/v1/config/{key}", config_put)
    router.add("GET", "/api/v1/config/special", config_special)
    router.add("GET", "/crash", crash)
    router.add("GET", "/teapot", teapot)
    router.add("GET", "/metrics", metrics)
    router.add("GET", "/bad", not_a_response)
    return router


async def start(nursery: trio.Nursery, router: Router | None = None, **kw) -> str:
    port = await nursery.start(lambda task_status: serve_http(router or make_router(), "127.0.0.1", 0, task_status=task_status, **kw))
    assert isinstance(port, int) and port > 0
    return f"127.0.0.1:{port}"


async def call(addr: str, method: str, path: str, body: object | None = None, token: str | None = None):
    return await trio.to_thread.run_sync(lambda: request_json(addr, method, path, body, token))


async def raw_exchange(addr: str, data: bytes, *, read_until_close: bool = True) -> bytes:
    host, port = addr.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(data)
        chunks = []
        with trio.fail_after(10):
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if not read_until_close:
                    break
    return b"".join(chunks)


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


async def test_routing_path_params_query_and_json_body() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        status, body = await call(addr, "GET", "/echo?a=1&b=x%20y&a=2&empty=")
        assert status == 200
        assert body["method"] == "GET" and body["path"] == "/echo"
        assert body["query"] == {"a": "2", "b": "x y", "empty": ""}
        assert body["peer"].startswith("127.0.0.1:")
        status, body = await call(addr, "POST", "/echo", {"x": [1, 2]}, token="tok")
        assert status == 200 and json.loads(body["body"]) == {"x": [1, 2]}
        assert body["ctype"] == "application/json" and body["auth"] == "Bearer tok"
        assert await call(addr, "GET", "/api/v1/config/max_inflight") == (200, {"key": "max_inflight"})
        # Percent-encoded segments are decoded into the parameter.
        assert await call(addr, "GET", "/api/v1/config/a%2Fb") == (200, {"key": "a/b"})
        # A literal route beats a parameter route.
        assert await call(addr, "GET", "/api/v1/config/special") == (200, {"special": True})
        # Trailing slash is not significant.
        assert await call(addr, "GET", "/api/v1/config/k/") == (200, {"key": "k"})
        assert await call(addr, "PUT", "/api/v1/config/k", {"v": 3}) == (201, {"key": "k", "value": {"v": 3}})
        nursery.cancel_scope.cancel()


async def test_404_405_and_handler_errors() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        status, body = await call(addr, "GET", "/nope")
        assert status == 404 and "nope" in body["error"]
        status, body = await call(addr, "GET", "/api/v1/config")  # too short for {key}
        assert status == 404
        status, body = await call(addr, "DELETE", "/api/v1/config/k")
        assert status == 405 and "DELETE" in body["error"]
        raw = await raw_exchange(addr, b"DELETE /api/v1/config/k HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert status_of(raw) == 405
        assert b"\r\nAllow: GET, HEAD, PUT\r\n" in raw
        assert await call(addr, "GET", "/teapot") == (418, {"error": "short and stout"})
        raw = await raw_exchange(addr, b"GET /teapot HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert b"\r\nX-Why: tea\r\n" in raw
        # Invalid JSON body -> 400 from Request.json().
        raw = await raw_exchange(
            addr, b"PUT /api/v1/config/k HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nconnection: close\r\n\r\n{x}"
        )
        assert status_of(raw) == 400 and b"not valid JSON" in raw
        nursery.cancel_scope.cancel()


async def test_handler_crash_is_500_and_connection_keeps_serving(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="mesh.http_api")
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        host, port = addr.split(":")

        def two_requests() -> list[tuple[int, bytes]]:
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            out = []
            for path in ("/crash", "/echo", "/bad"):
                conn.request("GET", path)
                resp = conn.getresponse()
                out.append((resp.status, resp.read()))
            conn.close()
            return out

        (s1, b1), (s2, b2), (s3, b3) = await trio.to_thread.run_sync(two_requests)
        assert s1 == 500 and json.loads(b1) == {"error": "internal server error"}
        assert s2 == 200 and json.loads(b2)["path"] == "/echo"
        assert s3 == 500
        crash_logs = [r for r in caplog.records if "crashed" in r.getMessage()]
        assert crash_logs and crash_logs[0].exc_info is not None
        assert "handler bug" in caplog.text
        nursery.cancel_scope.cancel()


async def test_keep_alive_two_requests_on_one_connection() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        host, port = addr.split(":")

        def run() -> tuple[str, str, object, object]:
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("GET", "/echo?n=1")
            r1 = json.loads(conn.getresponse().read())
            sock1 = conn.sock
            conn.request("POST", "/echo", body=b"second", headers={"Content-Type": "text/plain"})
            r2 = json.loads(conn.getresponse().read())
            sock2 = conn.sock
            conn.close()
            return r1["peer"], r2["peer"], sock1, sock2

        peer1, peer2, sock1, sock2 = await trio.to_thread.run_sync(run)
        # Same client port on the server side and the same client socket: one connection.
        assert peer1 == peer2 and sock1 is sock2
        nursery.cancel_scope.cancel()


async def test_pipelined_requests_on_raw_socket() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        raw = await raw_exchange(
            addr,
            b"GET /echo?i=1 HTTP/1.1\r\nhost: x\r\n\r\n"
            b"GET /echo?i=2 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        assert raw.count(b"HTTP/1.1 200 ") == 2
        assert b'"i":"1"' in raw and b'"i":"2"' in raw
        nursery.cancel_scope.cancel()


async def test_body_limit_413() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery, max_body=1000)
        # Declared too large: answered before the body is sent, then closed.
        raw = await raw_exchange(addr, b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1001\r\n\r\n")
        assert status_of(raw) == 413 and b"connection: close" in raw.lower()
        # Chunked body that grows past the limit.
        chunk = b"%x\r\n%s\r\n" % (600, b"a" * 600)
        raw = await raw_exchange(
            addr, b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + chunk + chunk + b"0\r\n\r\n"
        )
        assert status_of(raw) == 413
        # Exactly at the limit is fine.
        status, body = await call(addr, "POST", "/echo", "x" * 998)  # 998 + 2 quotes
        assert status == 200 and len(body["body"]) == 1000
        nursery.cancel_scope.cancel()


async def test_default_body_limit_is_one_mib_and_client_reads_413() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        status, body = await call(addr, "POST", "/echo", "x" * (1 << 20))  # 1 MiB + 2 quotes
        assert status == 413 and "body" in body["error"]
        status, _ = await call(addr, "POST", "/echo", "x" * ((1 << 20) - 2))
        assert status == 200
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /echo HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: nope\r\n\r\n",
    ],
)
async def test_bad_http_is_400_and_close(data: bytes) -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        raw = await raw_exchange(addr, data)  # returns only once the server closed
        assert status_of(raw) == 400
        # The server still serves others.
        assert (await call(addr, "GET", "/echo"))[0] == 200
        nursery.cancel_scope.cancel()


async def test_oversized_headers_431() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        # Larger than one read, so h11 sees an incomplete head over its limit.
        raw = await raw_exchange(addr, b"GET /echo HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n")
        assert status_of(raw) == 431
        nursery.cancel_scope.cancel()


async def test_idle_and_read_timeouts() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery, idle_timeout=0.3)
        # Idle connection: closed without a word.
        assert await raw_exchange(addr, b"") == b""
        # Half a request: 408, then closed.
        raw = await raw_exchange(addr, b"GET /echo HTTP/1.1\r\nhost")
        assert status_of(raw) == 408
        # Body never finished.
        raw = await raw_exchange(addr, b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        assert status_of(raw) == 408
        nursery.cancel_scope.cancel()


async def test_head_has_headers_no_body() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        raw = await raw_exchange(addr, b"HEAD /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert status_of(raw) == 200 and rest == b""
        assert b"content-length: 5" in head.lower()
        assert b"content-type: text/plain; version=0.0.4" in head.lower()
        nursery.cancel_scope.cancel()


async def test_slow_handler_does_not_block_other_connections() -> None:
    release = trio.Event()
    entered = trio.Event()
    router = make_router()

    async def slow(req: Request) -> Response:
        entered.set()
        await release.wait()
        return json_response({"slow": True})

    router.add("GET", "/slow", slow)
    async with trio.open_nursery() as nursery:
        addr = await start(nursery, router)
        results: list[object] = []

        async def slow_client() -> None:
            results.append(await call(addr, "GET", "/slow"))

        nursery.start_soon(slow_client)
        await entered.wait()
        assert (await call(addr, "GET", "/echo"))[0] == 200
        assert results == []
        release.set()
        with trio.fail_after(10):
            while not results:
                await trio.sleep(0.01)
        assert results == [(200, {"slow": True})]
        nursery.cancel_scope.cancel()


async def test_bind_error_is_oserror() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError) as e:
            await serve_http(Router(), "127.0.0.1", port)
        assert e.value.errno == errno.EADDRINUSE


def test_client_unreachable_names_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens there now.
    with pytest.raises(HttpClientError) as e:
        request_json(f"127.0.0.1:{port}", "GET", "/x", timeout=2)
    assert f"127.0.0.1:{port}" in str(e.value)


async def test_client_error_on_non_http_peer() -> None:
    async def not_http(stream: trio.SocketStream) -> None:
        await stream.receive_some(1024)
        await stream.send_all(b"SSH-2.0-nope\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, not_http, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(HttpClientError) as e:
            await trio.to_thread.run_sync(lambda: request_json(f"127.0.0.1:{port}", "GET", "/"))
        assert f"127.0.0.1:{port}" in str(e.value)
        nursery.cancel_scope.cancel()


async def test_client_accepts_url_and_returns_text_bodies() -> None:
    async with trio.open_nursery() as nursery:
        addr = await start(nursery)
        status, body = await call("http://" + addr + "/", "GET", "metrics")
        assert (status, body) == (200, "up 1\n")
        nursery.cancel_scope.cancel()


def test_router_rejects_bad_patterns_and_duplicates() -> None:
    router = Router()

    async def h(req: Request) -> Response:
        return json_response({})

    with pytest.raises(ValueError):
        router.add("GET", "no-slash", h)
    with pytest.raises(ValueError):
        router.add("GET", "/a/x{y}", h)
    with pytest.raises(ValueError):
        router.add("GET", "/a/{x}/{x}", h)
    router.add("GET", "/a", h)
    with pytest.raises(ValueError):
        router.add("get", "/a", h)


def test_response_helpers() -> None:
    r = json_response({"s": {2, 1}, "t": (1, "x")}, status=202)
    assert r.status == 202 and r.content_type == "application/json"
    assert json.loads(r.body) == {"s": [1, 2], "t": [1, "x"]}
    e = error_response(409, "conflict")
    assert e.status == 409 and json.loads(e.body) == {"error": "conflict"}
    t = text_response("héllo")
    assert t.body == "héllo".encode() and t.content_type == "text/plain; charset=utf-8"


def test_request_from_target_splits_as_the_server_does() -> None:
    r = Request.from_target("get", "/api/v1/subscriptions?topic=a%2Fb&limit=&topic=c")
    assert (r.method, r.path, r.query) == ("GET", "/api/v1/subscriptions", {"topic": "c", "limit": ""})
    assert Request.from_target("GET", "").path == "/"
