"""A plugin loaded by module path (`tests.plugins.faulty`) whose setup fails: the node
lists it as failed and runs on."""

from hooks.plugins import PluginContext


def setup(context: PluginContext) -> None:
    raise RuntimeError("faulty plugin: cannot start")
