"""The ready file (`--ready-file PATH`): written once every listener is bound, so a
supervisor, a script or a test waits for it instead of polling ports or sleeping.

It holds one JSON object: `{"node_id": ..., "pid": ..., "version": ..., "ports":
{"gossip": 7946, "mqtt": 1883, "http": 18083, ...}}`, the ports as bound (a
listener on port 0 gets its real port here). It is written atomically (a reader sees
the whole file or none), removed when the node starts (a file left by an earlier run
never says ready) and again on a clean stop.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

from mesh.config import ConfigError

__all__ = ["write_ready_file", "remove_ready_file"]


def remove_ready_file(path: str | None) -> None:
    if path is None:
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass  # not there: a first start, or a stop already removed it
    except OSError as exc:
        raise ConfigError("ready_file", f"cannot remove {path}: {exc.strerror or exc}") from None


def write_ready_file(path: str | None, node_id: str, version: str, ports: Mapping[str, int]) -> None:
    if path is None:
        return
    body = json.dumps({"node_id": node_id, "pid": os.getpid(), "version": version, "ports": dict(ports)})
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(body + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError("ready_file", f"cannot write {path}: {exc.strerror or exc}") from None
