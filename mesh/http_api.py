"""A small JSON HTTP/1.1 server: h11 for the protocol, Trio for the I/O.

h11 parses and frames; this module only moves bytes, routes requests to
`async def handler(request) -> Response`, and enforces the limits a node-local
admin API needs: a body limit (413), a read/idle timeout, 400 on bad HTTP, and
500 (logged with the traceback) when a handler raises, after which the server
keeps serving. Each connection is one task; nothing here blocks the node.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Awaitable, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

import h11
import trio

from mesh import __version__

__all__ = [
    "Request",
    "Response",
    "HttpError",
    "Router",
    "Handler",
    "json_response",
    "text_response",
    "error_response",
    "serve_http",
    "MAX_BODY",
    "IDLE_TIMEOUT",
]

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # 1 MiB of request body
IDLE_TIMEOUT = 30.0  # seconds to receive a whole request (and between requests)
MAX_HEADER_BYTES = 16 * 1024
RECV_SIZE = 64 * 1024
SERVER_HEADER = f"meshd/{__version__}".encode()


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""
    path_params: dict[str, str] = field(default_factory=dict)
    peer: str = ""

    @classmethod
    def from_target(cls, method: str, target: str, *, headers: dict[str, str] | None = None, body: bytes = b"",
                    peer: str = "") -> "Request":
        """A request for `target` as a request line carries it (`/path?query`): the
        server builds every request this way, and so can a caller that dispatches to a
        router in-process."""
        split = urlsplit(target)
        return cls(method=method.upper(), path=split.path or "/",
                   query=dict(parse_qsl(split.query, keep_blank_values=True)), headers=headers or {}, body=body,
                   peer=peer)

    def json(self) -> object:
        """The body as JSON; raises HttpError(400) if it is not."""
        if not self.body:
            raise HttpError(400, "request body must be JSON")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, f"request body is not valid JSON: {e}") from None


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class HttpError(Exception):
    """Raise from a handler to answer `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message
        self.headers = headers or {}


Handler = Callable[[Request], Awaitable[Response]]


def _json_default(obj: object) -> object:
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, tuple):
        return list(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def json_response(obj: object, status: int = 200) -> Response:
    body = json.dumps(obj, default=_json_default, separators=(",", ":"), ensure_ascii=False)
    return Response(status, body.encode("utf-8") + b"\n", "application/json")


def text_response(text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Response:
    return Response(status, text.encode("utf-8"), content_type)


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


# -- routing -------------------------------------------------------------------

_PARAM = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class _Route:
    __slots__ = ("pattern", "segments", "params", "methods", "rank")

    def __init__(self, pattern: str) -> None:
        if not pattern.startswith("/"):
            raise ValueError(f"route pattern must start with /: {pattern!r}")
        self.pattern = pattern
        self.segments: list[str | None] = []  # None marks a {param} segment
        self.params: list[str] = []
        for seg in _split_path(pattern):
            m = _PARAM.match(seg)
            if m:
                if m.group(1) in self.params:
                    raise ValueError(f"duplicate parameter {m.group(1)!r} in {pattern!r}")
                self.segments.append(None)
                self.params.append(m.group(1))
            elif "{" in seg or "}" in seg:
                raise ValueError(f"a parameter must be a whole segment: {pattern!r}")
            else:
                self.segments.append(seg)
        self.methods: dict[str, Handler] = {}
        # Literal segments beat parameters, left to right: /a/b before /a/{x}.
        self.rank = tuple(seg is None for seg in self.segments)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if len(parts) != len(self.segments):
            return None
        values: list[str] = []
        for seg, part in zip(self.segments, parts):
            if seg is None:
                if not part:
                    return None
                values.append(part)
            elif seg != part:
                return None
        return dict(zip(self.params, values))


def _split_path(path: str) -> list[str]:
    # "/" -> [], "/a/b/" -> ["a", "b"]: a trailing slash is not significant.
    stripped = path.strip("/")
    return stripped.split("/") if stripped else []


class Router:
    """Maps (method, path pattern) to handlers; `{name}` segments are parameters."""

    def __init__(self) -> None:
        self._routes: dict[str, _Route] = {}

    def add(self, method: str, pattern: str, handler: Handler) -> None:
        route = self._routes.get(pattern)
        if route is None:
            route = _Route(pattern)
            self._routes[pattern] = route
        method = method.upper()
        if method in route.methods:
            raise ValueError(f"{method} {pattern} is already routed")
        route.methods[method] = handler

    def get(self, pattern: str, handler: Handler) -> None:
        self.add("GET", pattern, handler)

    def post(self, pattern: str, handler: Handler) -> None:
        self.add("POST", pattern, handler)

    def put(self, pattern: str, handler: Handler) -> None:
        self.add("PUT", pattern, handler)

    def delete(self, pattern: str, handler: Handler) -> None:
        self.add("DELETE", pattern, handler)

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict[str, str], list[str]]:
        """(handler, path params, allowed methods); handler None means 404 or 405."""
        parts = [unquote(p) for p in _split_path(path)]
        matches = sorted(
            ((r, params) for r in self._routes.values() if (params := r.match(parts)) is not None),
            key=lambda rp: rp[0].rank,
        )
        allowed: set[str] = set()
        for route, params in matches:
            handler = route.methods.get(method)
            if handler is None and method == "HEAD":
                handler = route.methods.get("GET")
            if handler is not None:
                return handler, params, []
            allowed.update(route.methods)
        if "GET" in allowed:
            allowed.add("HEAD")
        return None, {}, sorted(allowed)

    async def dispatch(self, request: Request) -> Response:
        """Route and run one request; never raises (a crash becomes a logged 500)."""
        handler, params, allowed = self.resolve(request.method, request.path)
        if handler is None:
            if allowed:
                resp = error_response(405, f"method {request.method} not allowed on {request.path}")
                resp.headers["Allow"] = ", ".join(allowed)
                return resp
            return error_response(404, f"no such path: {request.path}")
        request.path_params = params
        try:
            response = await handler(request)
        except HttpError as e:
            resp = error_response(e.status, e.message)
            resp.headers.update(e.headers)
            return resp
        except Exception:
            log.exception("HTTP handler for %s %s crashed", request.method, request.path)
            return error_response(500, "internal server error")
        if not isinstance(response, Response):
            log.error("HTTP handler for %s %s returned %r, not a Response", request.method, request.path, type(response))
            return error_response(500, "internal server error")
        return response


# -- server --------------------------------------------------------------------


class _Close(Exception):
    """Ends a connection after whatever answer has been sent."""


async def serve_http(
    router: Router,
    host: str,
    port: int,
    *,
    max_body: int = MAX_BODY,
    idle_timeout: float = IDLE_TIMEOUT,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `router` on host:port until cancelled; `task_status.started(port)`.

    Use as `port = await nursery.start(serve_http, router, host, 0)`. A binding
    failure (e.g. address in use) raises the `OSError` unchanged.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    log.info("HTTP API listening on %s", ", ".join(_sockname(ln) for ln in listeners))
    task_status.started(bound)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _serve_connection(stream, router, max_body, idle_timeout)
        except Exception:
            # One broken connection must never take the server (or the node) down.
            log.exception("HTTP connection failed")
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()

    await trio.serve_listeners(handle, listeners)


def _sockname(listener: trio.SocketListener) -> str:
    addr = listener.socket.getsockname()
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


def _peer(stream: trio.SocketStream) -> str:
    try:
        addr = stream.socket.getpeername()
    except OSError:
        return ""
    if isinstance(addr, tuple):
        return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"
    return str(addr)


async def _serve_connection(stream: trio.SocketStream, router: Router, max_body: int, idle_timeout: float) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    peer = _peer(stream)
    while True:
        try:
            with trio.move_on_after(idle_timeout) as timeout:
                request = await _read_request(conn, stream, peer, max_body)
            if timeout.cancelled_caught:
                # Idle keep-alive connections just go; a half-sent request gets 408.
                if conn.their_state is h11.SEND_BODY or _has_partial_request(conn):
                    await _send_error(conn, stream, 408, "request timed out")
                return
            if request is None:
                return  # the client closed the connection
        except h11.RemoteProtocolError as e:
            status = e.error_status_hint if 400 <= e.error_status_hint < 500 else 400
            await _send_error(conn, stream, status, f"bad request: {e}")
            await _linger(stream)
            return
        except _Close:
            return

        response = await router.dispatch(request)
        headers = _response_headers(response, len(response.body))
        # HEAD: the GET handler's headers (Content-Length included), no body.
        body = b"" if request.method == "HEAD" else response.body
        try:
            with trio.fail_after(idle_timeout):
                await _send(conn, stream, h11.Response(status_code=response.status, headers=headers))
                if body:
                    await _send(conn, stream, h11.Data(data=body))
                await _send(conn, stream, h11.EndOfMessage())
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            return
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
            return
        conn.start_next_cycle()


def _has_partial_request(conn: h11.Connection) -> bool:
    # Bytes of a request received but not yet a whole head.
    return bool(conn.trailing_data[0])


def _response_headers(response: Response, length: int) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = [
        (b"server", SERVER_HEADER),
        (b"content-type", response.content_type.encode("latin-1")),
        (b"content-length", str(length).encode()),
    ]
    for name, value in response.headers.items():
        if name.lower() in ("content-length", "content-type"):
            continue
        headers.append((name.encode("latin-1"), value.encode("latin-1")))
    return headers


async def _read_request(
    conn: h11.Connection, stream: trio.SocketStream, peer: str, max_body: int
) -> Request | None:
    event = await _next_event(conn, stream)
    if isinstance(event, h11.ConnectionClosed):
        return None
    assert isinstance(event, h11.Request), event
    head: h11.Request = event
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    declared = headers.get("content-length")
    if declared is not None and int(declared) > max_body:
        await _send_error(conn, stream, 413, f"request body over {max_body} bytes")
        await _linger(stream)
        raise _Close
    if conn.they_are_waiting_for_100_continue:
        await _send(conn, stream, h11.InformationalResponse(status_code=100, headers=[]))
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await _next_event(conn, stream)
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > max_body:
                await _send_error(conn, stream, 413, f"request body over {max_body} bytes")
                await _linger(stream)
                raise _Close
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise _Close
    return Request.from_target(head.method.decode("ascii"), head.target.decode("latin-1"), headers=headers,
                               body=b"".join(chunks), peer=peer)


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event:
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Event):
            return event
        if event is h11.PAUSED:
            raise _Close
        # h11.NEED_DATA
        try:
            data = await stream.receive_some(RECV_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        conn.receive_data(data)


async def _send(conn: h11.Connection, stream: trio.SocketStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)


async def _send_error(conn: h11.Connection, stream: trio.SocketStream, status: int, message: str) -> None:
    """Answer an error and mark the connection for closing, if h11 still lets us."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    response = error_response(status, message)
    response.headers["Connection"] = "close"
    try:
        with trio.move_on_after(5):
            await _send(conn, stream, h11.Response(status_code=status, headers=_response_headers(response, len(response.body))))
            await _send(conn, stream, h11.Data(data=response.body))
            await _send(conn, stream, h11.EndOfMessage())
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
        pass


async def _linger(stream: trio.SocketStream) -> None:
    """Half-close, then drain what the client still sends, so it reads our answer.

    Closing a socket with unread input makes the kernel send RST, which can
    destroy the error response before the client reads it.
    """
    try:
        await stream.send_eof()
        with trio.move_on_after(2):
            drained = 0
            while drained < 16 * MAX_BODY:
                data = await stream.receive_some(RECV_SIZE)
                if not data:
                    break
                drained += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
