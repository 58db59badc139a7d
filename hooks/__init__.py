"""Hooks: a chain of responsibility at each point of a client's and a message's life
(the emqttd 2.0 design). `Hooks` is the registry the node builds once and hands to the
broker, the clients, the rule engine and the plugins; `HookPoint` names the points.
"""

from hooks.points import HookPoint
from hooks.registry import DROP, HookError, Hooks, Registration, Stop

__all__ = ["DROP", "HookError", "HookPoint", "Hooks", "Registration", "Stop"]
