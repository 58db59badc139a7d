"""Prometheus metrics in text exposition format 0.0.4, without a dependency.

The hot path keeps a child it got once and calls `child.inc()`: a plain
attribute add, no dict lookup, no lock (Trio runs one task at a time).

    metrics = Metrics()
    msgs_in = metrics.counter("meshd_messages_received_total", "PUBLISH received", ["qos"])
    self.msgs_in_qos1 = msgs_in.labels(qos="1")     # once
    self.msgs_in_qos1.inc()                         # per message
    metrics.gauge_callback("meshd_sessions", "sessions held", lambda: len(store))
    text = metrics.render()
"""

from __future__ import annotations

import logging
import math
import re
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, Sequence, TypeVar

if TYPE_CHECKING:
    from mesh.http_api import Router

__all__ = ["Metrics", "Counter", "Gauge", "CONTENT_TYPE", "add_metrics_route"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelValues = tuple[str, ...]
# A callback's reading: a number, or one per label value (a bare string when the metric
# has a single label, a tuple of them otherwise).
Reading = float | Mapping[str, float] | Mapping[LabelValues, float]
CallbackFn = Callable[[], Reading]


def _check_labelnames(labelnames: Iterable[str]) -> tuple[str, ...]:
    names = tuple(labelnames)
    if isinstance(labelnames, str):
        raise TypeError("labelnames must be a sequence of names, not a string")
    for label in names:
        if not _LABEL_RE.match(label) or label.startswith("__"):
            raise ValueError(f"invalid label name {label!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate label names in {names!r}")
    return names


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _labels_text(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    inner = ",".join(f'{n}="{_escape_label(v)}"' for n, v in zip(names, values))
    return "{" + inner + "}"


ChildT = TypeVar("ChildT", bound="_Metric[Any]")


class _Metric(Generic[ChildT]):
    """Shared parts: name, help, label names, cached children (of type ChildT: a
    leaf subclass whose methods skip the checks)."""

    type_name = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (), _values: LabelValues = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self.labelvalues = _values
        self.value: float = 0
        self._children: dict[LabelValues, ChildT] = {}

    def _make_child(self, key: LabelValues) -> ChildT:
        raise NotImplementedError

    def labels(self, *values: str, **kv: str) -> ChildT:
        """The child for these label values (cached: keep it and call it directly)."""
        if not self.labelnames:
            raise ValueError(f"{self.name} has no labels")
        if self.labelvalues:
            raise ValueError(f"{self.name}: labels() on a child")
        if values and kv:
            raise TypeError("pass label values by position or by name, not both")
        if kv:
            if set(kv) != set(self.labelnames):
                raise ValueError(f"{self.name} takes labels {list(self.labelnames)}, got {sorted(kv)}")
            key = tuple(str(kv[n]) for n in self.labelnames)
        else:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {list(self.labelnames)}")
            key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._make_child(key)
            self._children[key] = child
        return child

    def remove(self, **kv: str) -> None:
        """Forget one child (e.g. a departed peer), so it is no longer rendered."""
        key = tuple(str(kv[n]) for n in self.labelnames)
        self._children.pop(key, None)

    def _check_leaf(self) -> None:
        if self.labelnames and not self.labelvalues:
            raise ValueError(f"{self.name} has labels {list(self.labelnames)}: use .labels(...) first")

    def samples(self) -> list[tuple[LabelValues, float]]:
        if self.labelnames:
            return [(key, child.value) for key, child in sorted(self._children.items())]
        return [((), self.value)]


class Counter(_Metric["_CounterChild"]):
    """Only goes up. `inc(n)` on an unlabelled counter or on a `.labels()` child."""

    type_name = "counter"

    def _make_child(self, key: LabelValues) -> _CounterChild:
        return _CounterChild(self.name, self.help, self.labelnames, key)

    def inc(self, n: float = 1) -> None:
        if n < 0:
            raise ValueError(f"{self.name}: counters only go up (inc({n}))")
        self._check_leaf()
        self.value += n

    def get(self) -> float:
        self._check_leaf()
        return self.value


class Gauge(_Metric["_GaugeChild"]):
    """Goes up and down: `set`, `inc`, `dec`."""

    type_name = "gauge"

    def _make_child(self, key: LabelValues) -> _GaugeChild:
        return _GaugeChild(self.name, self.help, self.labelnames, key)

    def set(self, value: float) -> None:
        self._check_leaf()
        self.value = value

    def inc(self, n: float = 1) -> None:
        self._check_leaf()
        self.value += n

    def dec(self, n: float = 1) -> None:
        self._check_leaf()
        self.value -= n

    def get(self) -> float:
        self._check_leaf()
        return self.value


# Children returned by .labels() are always leaves: their methods skip the
# leaf check, so the hot path is one comparison and one attribute add.


class _CounterChild(Counter):
    def inc(self, n: float = 1) -> None:
        if n < 0:
            raise ValueError(f"{self.name}: counters only go up (inc({n}))")
        self.value += n


class _GaugeChild(Gauge):
    def set(self, value: float) -> None:
        self.value = value

    def inc(self, n: float = 1) -> None:
        self.value += n

    def dec(self, n: float = 1) -> None:
        self.value -= n



class _Callback:
    """A metric read at render time from `fn`."""

    def __init__(
        self,
        name: str,
        help: str,
        type_name: str,
        fn: CallbackFn,
        labelnames: tuple[str, ...],
    ) -> None:
        self.name = name
        self.help = help
        self.type_name = type_name
        self.fn = fn
        self.labelnames = labelnames

    def samples(self) -> list[tuple[LabelValues, float]]:
        try:
            result = self.fn()
        except Exception:
            # A broken callback must not take /metrics down with it.
            log.exception("metric callback %s failed", self.name)
            return []
        if not self.labelnames:
            if not isinstance(result, (int, float)):
                log.error("metric callback %s returned %r, not a number", self.name, result)
                return []
            return [((), result)]
        if not isinstance(result, Mapping):
            log.error("metric callback %s returned %r, not a value per label", self.name, result)
            return []
        out: list[tuple[LabelValues, float]] = []
        for raw_key, value in result.items():
            key = (raw_key,) if isinstance(raw_key, str) else tuple(str(k) for k in raw_key)
            if len(key) != len(self.labelnames):
                log.error("metric callback %s returned labels %r for %r", self.name, key, self.labelnames)
                continue
            out.append((key, value))
        return sorted(out)


class Metrics:
    """A registry of named metrics, rendered in Prometheus text format."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric[Any] | _Callback] = {}

    def _register(self, name: str, metric: _Metric[Any] | _Callback) -> None:
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if name in self._metrics:
            raise ValueError(f"metric {name!r} already registered")
        self._metrics[name] = metric

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help, _check_labelnames(labelnames))
        self._register(name, metric)
        return metric

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help, _check_labelnames(labelnames))
        self._register(name, metric)
        return metric

    def gauge_callback(
        self,
        name: str,
        help: str,
        fn: CallbackFn,
        labelnames: Sequence[str] = (),
    ) -> None:
        """A gauge read by calling `fn()` at render time.

        With `labelnames`, `fn` returns `{(label values...): value}` (a plain
        string key is fine for one label).
        """
        self._register(name, _Callback(name, help, "gauge", fn, _check_labelnames(labelnames)))

    def counter_callback(
        self,
        name: str,
        help: str,
        fn: CallbackFn,
        labelnames: Sequence[str] = (),
    ) -> None:
        """A counter kept elsewhere (e.g. in a sans-I/O core), read at render time."""
        self._register(name, _Callback(name, help, "counter", fn, _check_labelnames(labelnames)))

    def unregister(self, name: str) -> None:
        self._metrics.pop(name, None)

    def names(self) -> list[str]:
        return list(self._metrics)

    def get(self, name: str) -> Counter | Gauge | None:
        metric = self._metrics.get(name)
        return metric if isinstance(metric, (Counter, Gauge)) else None

    def render(self) -> str:
        """The text exposition format 0.0.4 (ends with a newline)."""
        lines: list[str] = []
        for name, metric in self._metrics.items():
            lines.append(f"# HELP {name} {_escape_help(metric.help)}")
            lines.append(f"# TYPE {name} {metric.type_name}")
            for values, value in metric.samples():
                lines.append(f"{name}{_labels_text(metric.labelnames, values)} {_format_value(value)}")
        return "\n".join(lines) + "\n" if lines else ""


def add_metrics_route(router: Router, metrics: Metrics, path: str = "/metrics") -> None:
    """Serve `metrics.render()` at GET `path` on an `mesh.http_api.Router`."""
    from mesh.http_api import Request, Response

    async def handler(request: Request) -> Response:
        return Response(200, metrics.render().encode("utf-8"), CONTENT_TYPE)

    router.add("GET", path, handler)
