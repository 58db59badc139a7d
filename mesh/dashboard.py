"""The dashboard's files (`mesh/web/`, package data): `/` is the page, `/ui/NAME` its
script, style and the small MQTT-over-WebSocket client of its panel.

The files are static and carry no data: the page reads everything through the JSON
API (`mesh/api.py`) with the admin token, if one is set, so they are served to anyone
who can reach the HTTP listener (that is how a browser gets the login form). The
Content-Security-Policy keeps the page to its own files: no inline script, no other
origin except WebSocket connections (the node's MQTT WebSocket listener has a port of
its own)."""

from __future__ import annotations

from importlib import resources

from mesh.http_api import Request, Response, Router, error_response

FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "pages.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "mqttws.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def load_files() -> dict[str, bytes]:
    """Every file of the dashboard, read once (they are a few kilobytes)."""
    web = resources.files("mesh") / "web"
    return {name: (web / name).read_bytes() for name in FILES}


def add_dashboard_routes(router: Router) -> None:
    files = load_files()

    def respond(name: str) -> Response:
        return Response(200, files[name], FILES[name], dict(SECURITY_HEADERS))

    async def index(request: Request) -> Response:
        return respond("index.html")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in files:
            return error_response(404, f"no such file: {name}")
        return respond(name)

    router.add("GET", "/", index)
    router.add("GET", "/ui/{name}", asset)
