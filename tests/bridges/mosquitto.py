"""A real Mosquitto broker for the bridge tests: started on a free port on 127.0.0.1,
stopped and started again on the same port (a target outage)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from tests.support import free_port


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    assert found, "Debian's mosquitto package is needed (scripts/test installs it)"
    return found


class Mosquitto:
    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        os.makedirs(workdir, exist_ok=True)
        self.config = os.path.join(workdir, "mosquitto.conf")
        with open(self.config, "w", encoding="utf-8") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 1000000\nmax_inflight_messages 0\n")
        self.log_file = os.path.join(workdir, "mosquitto.log")

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> "Mosquitto":
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen([mosquitto_binary(), "-c", self.config], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"mosquitto did not start: {self.output()}")
                time.sleep(0.02)  # polling the port: the condition, not a guess

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def output(self) -> str:
        try:
            with open(self.log_file, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""
