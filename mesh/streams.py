"""Byte streams a client connection reads and writes: the interface, and a lean one for
plain TCP sockets (TLS and WebSocket clients use `trio.SSLStream` and `mesh.ws`)."""

from __future__ import annotations

import socket
from typing import Protocol

import trio

READ_SIZE = 65536


class ByteStream(Protocol):
    async def receive_some(self, max_bytes: int | None = None) -> bytes: ...
    async def send_all(self, data: bytes) -> None: ...
    async def aclose(self) -> None: ...


class SocketByteStream:
    """A connected non-blocking `socket.socket` as a ByteStream, for plain TCP clients.

    What `trio.SocketStream` does, with the same checkpoints and errors, minus what
    an idle client pays for it (~2 KB: trio's socket wrapper, two conflict
    detectors, and the frames of its helpers while a read waits). One reader task
    and at most one writer task use it, never two of either.
    """

    __slots__ = ("_sock",)

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive_nowait(self, max_bytes: int = READ_SIZE) -> bytes | None:
        """Whatever the socket has now (b"" at EOF), None when nothing; no checkpoint."""
        sock = self._sock
        try:
            return sock.recv(max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise _stream_error(sock, exc) from exc

    def send_nowait(self, data: bytes) -> int:
        """Send what the socket takes now; how many bytes that was. No checkpoint."""
        sock = self._sock
        try:
            return sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _stream_error(sock, exc) from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        sock = self._sock
        size = max_bytes or READ_SIZE
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            try:
                data = sock.recv(size)
                break
            except BlockingIOError:
                pass
            except OSError as exc:
                raise _stream_error(sock, exc) from exc
            # Wait outside the except block: a handled exception (with its traceback)
            # would stay alive for as long as the client is idle (~0.5 KB).
            await trio.lowlevel.wait_readable(sock)
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def send_all(self, data: bytes) -> None:
        sock = self._sock
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        try:
            with memoryview(data) as view:
                total = len(view)
                sent = 0
                while sent < total:
                    try:
                        sent += sock.send(view[sent:] if sent else view)
                        continue
                    except BlockingIOError:
                        pass
                    await trio.lowlevel.wait_writable(sock)
                    waited = True
        except OSError as exc:
            raise _stream_error(sock, exc) from exc
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def aclose(self) -> None:
        sock = self._sock
        if sock.fileno() != -1:
            trio.lowlevel.notify_closing(sock)  # a task waiting on it gets ClosedResourceError
            sock.close()
        await trio.lowlevel.checkpoint()


def _stream_error(sock: socket.socket, exc: OSError) -> Exception:
    if sock.fileno() == -1:
        return trio.ClosedResourceError("socket was closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")
