"""Helpers of the bridge tests."""

from __future__ import annotations

from typing import Any

from bridges import BridgeManager


def bridge_manager(node: Any) -> BridgeManager:
    """The node's bridges (one of the parts `Node` runs beside the others)."""
    return next(s for s in node.services if isinstance(s, BridgeManager))
