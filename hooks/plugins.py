"""Plugins: Python code that adds callbacks to the hook points.

A plugin is found by name, first in the `meshd.plugins` entry-point group (a package
declares `[options.entry_points] meshd.plugins = name = package.module[:attr]`), else
as a module path (`package.module` or `package.module:attr`). What it names is a
module with a `setup(context)` function, or such a function itself; `setup` adds the
plugin's callbacks through `context.add(point, callback, priority)`, which names them
`<plugin>/<callback>` so the logs and `/metrics` say whose a failure is.

A plugin that cannot be found, imported or set up is logged, listed with its error
and skipped; the node runs on without it. A callback that raises later is the
registry's to handle (`hooks.registry`).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Iterable

from hooks.points import HookPoint
from hooks.registry import Callback, Hooks, Registration

log = logging.getLogger("meshd.plugins")

GROUP = "meshd.plugins"


@dataclass
class PluginContext:
    """What a plugin's `setup` is given."""

    name: str
    node_id: str
    hooks: Hooks
    log: logging.Logger
    registrations: list[Registration] = field(default_factory=list)

    def add(self, point: HookPoint, callback: Callback, priority: int = 0, name: str = "") -> Registration:
        label = name or getattr(callback, "__name__", "callback")
        reg = self.hooks.add(point, callback, priority, f"{self.name}/{label}")
        self.registrations.append(reg)
        return reg


@dataclass
class Plugin:
    """One plugin as the node loaded it (`GET /api/v1/plugins`)."""

    name: str
    origin: str  # "entry point <value> (<distribution>)" or "module <path>"
    status: str  # "loaded" or "failed"
    error: str | None = None
    registrations: list[Registration] = field(default_factory=list)

    def errors(self, hooks: Hooks) -> int:
        prefix = self.name + "/"
        return sum(n for cb, n in hooks.errors.items() if cb.startswith(prefix))

    def as_dict(self, hooks: Hooks) -> dict[str, Any]:
        return {"name": self.name, "origin": self.origin, "status": self.status, "error": self.error,
                "hooks": [{"point": r.point.value, "callback": r.name, "priority": r.priority} for r in self.registrations],
                "errors": self.errors(hooks)}


def load_plugins(names: Iterable[str], hooks: Hooks, *, node_id: str,
                 available: Callable[[], Iterable[EntryPoint]] | None = None) -> list[Plugin]:
    """Load each named plugin (entry point first, else module path), in order."""
    found = {ep.name: ep for ep in (available() if available is not None else entry_points(group=GROUP))}
    return [_load(name, found.get(name), hooks, node_id) for name in names]


def _load(name: str, ep: EntryPoint | None, hooks: Hooks, node_id: str) -> Plugin:
    if ep is not None:
        dist = getattr(ep, "dist", None)
        origin = f"entry point {ep.value}" + (f" ({dist.name})" if dist is not None else "")
        label = name
    else:
        origin = f"module {name}"
        label = name.replace(":", ".")
    plugin = Plugin(label, origin, "failed")
    try:
        target = ep.load() if ep is not None else _import(name)
        setup = getattr(target, "setup", target)
        if not callable(setup):
            raise TypeError(f"{name} has no setup(context) function")
        context = PluginContext(label, node_id, hooks, logging.getLogger(f"meshd.plugins.{label}"))
        try:
            setup(context)
        except BaseException:
            for reg in context.registrations:  # half set up: take back what it added
                hooks.remove(reg)
            raise
    except Exception as exc:
        plugin.error = f"{type(exc).__name__}: {exc}"
        log.error("plugin %s (%s) not loaded: %s", label, origin, plugin.error)
        return plugin
    plugin.status = "loaded"
    plugin.registrations = context.registrations
    log.info("plugin %s loaded (%s): %d callbacks", label, origin, len(context.registrations))
    return plugin


def _import(path: str) -> Any:
    """`package.module` or `package.module:attr`."""
    module_name, _, attr = path.partition(":")
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise ImportError(f"no plugin {path!r} in the {GROUP} entry points, and not a module path")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module
