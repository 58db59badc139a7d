"""Byte streams a client connection reads and writes: the interface, and a lean one for
plain TCP sockets (TLS and WebSocket clients use `trio.SSLStream` and `mesh.ws`)."""

from __future__ import annotations

import fcntl
import os
import socket
from typing import Protocol

import trio

READ_SIZE = 65536


class ByteStream(Protocol):
    async def receive_some(self, max_bytes: int | None = None) -> bytes: ...
    async def send_all(self, data: bytes) -> None: ...
    async def aclose(self) -> None: ...


class SocketByteStream:
    """A connected non-blocking TCP socket, held by its file descriptor, as a ByteStream
    for plain TCP clients.

    What `trio.SocketStream` does, with the same checkpoints and errors, minus what
    an idle client pays for it (~2 KB: trio's socket wrapper, two conflict
    detectors, and the frames of its helpers while a read waits; and the
    `socket.socket` object, ~0.1 KB: a descriptor is all that reading and writing
    need). One reader task and at most one writer task use it, never two of either.
    The stream owns the descriptor: `aclose` closes it.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int, *, accepted: bool = False) -> None:
        """`accepted`: `fd` comes straight from accept(), with no file status flag set,
        so one fcntl sets O_NONBLOCK (`os.set_blocking` reads the flags first: two
        system calls per connect)."""
        if accepted:
            fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)
        else:
            os.set_blocking(fd, False)
        self._fd = fd  # -1 once closed

    @classmethod
    def of_socket(cls, sock: socket.socket) -> "SocketByteStream":
        """Take over a connected socket (the socket object lets go of its descriptor)."""
        return cls(sock.detach())

    def fileno(self) -> int:
        return self._fd

    def receive_nowait(self, max_bytes: int = READ_SIZE) -> bytes | None:
        """Whatever the socket has now (b"" at EOF), None when nothing; no checkpoint."""
        try:
            return os.read(self._fd, max_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise self._error(exc) from exc

    def send_nowait(self, data: bytes) -> int:
        """Send what the socket takes now; how many bytes that was. No checkpoint."""
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise self._error(exc) from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = max_bytes or READ_SIZE
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            fd = self._fd
            try:
                data = os.read(fd, size)
                break
            except BlockingIOError:
                pass
            except OSError as exc:
                raise self._error(exc) from exc
            # Wait outside the except block: a handled exception (with its traceback)
            # would stay alive for as long as the client is idle (~0.5 KB).
            await trio.lowlevel.wait_readable(fd)
            waited = True
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def send_all(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        write = os.write
        try:
            with memoryview(data) as view:
                total = len(view)
                sent = 0
                while sent < total:
                    try:
                        sent += write(self._fd, view[sent:] if sent else view)
                        continue
                    except BlockingIOError:
                        pass
                    await trio.lowlevel.wait_writable(self._fd)
                    waited = True
        except OSError as exc:
            raise self._error(exc) from exc
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def aclose(self) -> None:
        fd = self._fd
        if fd != -1:
            self._fd = -1
            trio.lowlevel.notify_closing(fd)  # a task waiting on it gets ClosedResourceError
            os.close(fd)
        await trio.lowlevel.checkpoint()

    def _error(self, exc: OSError) -> Exception:
        if self._fd == -1:
            return trio.ClosedResourceError("socket was closed")
        return trio.BrokenResourceError(f"socket connection broken: {exc}")
