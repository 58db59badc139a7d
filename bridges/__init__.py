"""Bridges (issue 24): MQTT and HTTP targets fed through a durable cache queue.

`BridgeManager` (manager.py) is what the node builds: the bridges in effect, the
`message.publish` egress hook, the queues (`queue.py`, sans-I/O; `committer.py`, group
commit; `store.py`, RocksDB), the drivers (`mqtt_bridge.py` on the client machine of
`mqtt_client.py`; `http_bridge.py` on `http_client.py`) and the rule actions
(`actions.py`). `config.py` checks a `[[bridges]]` table.
"""

from bridges.config import BridgeConfig, BridgeConfigError, parse_bridge
from bridges.manager import BridgeManager, UnknownBridge

__all__ = ["BridgeConfig", "BridgeConfigError", "BridgeManager", "UnknownBridge", "parse_bridge"]
