"""A tiny synchronous JSON client for a node's HTTP API (used by CLI commands).

Stdlib only (`urllib.request`), proxies ignored: the API is node-local and must
never be sent through an `http_proxy` from the environment.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["HttpClientError", "request_json", "base_url"]


class HttpClientError(Exception):
    """The node could not be reached (or answered something that is not HTTP)."""

    def __init__(self, http_addr: str, message: str) -> None:
        super().__init__(f"cannot reach meshd HTTP API at {http_addr}: {message}")
        self.http_addr = http_addr
        self.reason = message


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def base_url(http_addr: str) -> str:
    """`127.0.0.1:18083`, `[::1]:18083` or a full `http://...` URL -> base URL."""
    addr = http_addr.strip().rstrip("/")
    if addr.startswith(("http://", "https://")):
        return addr
    return "http://" + addr


def request_json(
    http_addr: str,
    method: str,
    path: str,
    body: object | None = None,
    token: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, object]:
    """Send one request; return (status, decoded JSON body).

    Error statuses (4xx/5xx) are returned, not raised: the caller decides what
    a 404 means. A body that is not JSON comes back as text. Raises
    `HttpClientError` when the node is unreachable or the answer is not HTTP.
    """
    if not path.startswith("/"):
        path = "/" + path
    url = base_url(http_addr) + path
    data: bytes | None = None
    headers = {"Accept": "application/json"}
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method.upper(), headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.status, _decode(resp.read(), resp.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as e:
        with e:
            return e.code, _decode(e.read(), e.headers.get("Content-Type", "") if e.headers else "")
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            raise HttpClientError(http_addr, f"no answer within {timeout:g} s") from None
        raise HttpClientError(http_addr, str(getattr(reason, "strerror", None) or reason)) from None
    except TimeoutError:
        raise HttpClientError(http_addr, f"no answer within {timeout:g} s") from None
    except http.client.InvalidURL as e:
        raise HttpClientError(http_addr, f"bad address ({e})") from None
    except http.client.HTTPException as e:
        raise HttpClientError(http_addr, f"not an HTTP answer ({type(e).__name__})") from None
    except OSError as e:
        raise HttpClientError(http_addr, e.strerror or str(e) or type(e).__name__) from None
    except ValueError as e:  # a malformed address, e.g. a bad port
        raise HttpClientError(http_addr, f"bad address ({e})") from None


def _decode(raw: bytes, content_type: str) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type.lower() or not content_type:
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            return text
    return text
