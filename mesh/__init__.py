"""meshd: a peer-to-peer MQTT broker mesh.

`mesh` is the connection layer: listeners, per-connection tasks, the CLI and config.
The sans-I/O MQTT protocol core lives in `mqtt`.
"""

__version__ = "0.1.0"
