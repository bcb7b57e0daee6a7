"""The connections of ``hybridflow sandbox serve``: slots, each request's deadline, and the share of slots that
connections which have not shown the token may hold.

A slow client (slow loris) sends a byte now and then, so a per-read idle time-out never fires: 600 such clients
held every one of the 512 slots and the authenticated ``/run_code`` got 503 (issue 34). So:

* a request must arrive whole (request line, headers and body) within ``request_timeout_s`` of its first byte
  being awaited, however it trickles in: past that a reaper answers 408 and closes the connection;
* connections that have not authenticated yet may hold at most ``max_unauthenticated`` slots: a new connection
  over that share evicts the oldest unauthenticated one (503), so a client with the token always gets a slot
  unless every slot runs an authenticated request.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

READING, AUTHENTICATED, RUNNING, DROPPED = "reading", "authenticated", "running", "dropped"


@dataclass
class _Connection:
    state: str
    deadline: float


class ConnectionTable:
    """Thread-safe: the accept loop admits, handler threads move their own connection through the states, the
    reaper drops connections whose request is late."""

    def __init__(self, max_connections: int, max_unauthenticated: int, request_timeout_s: float):
        if not 1 <= max_unauthenticated <= max_connections:
            raise ValueError(f"--max-unauthenticated must be between 1 and --max-connections ({max_connections}), "
                             f"got {max_unauthenticated}")
        if not request_timeout_s > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {request_timeout_s}")
        self.max_connections, self.max_unauthenticated = max_connections, max_unauthenticated
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}
        self.evicted = self.expired = 0

    def admit(self, sock: socket.socket) -> tuple[bool, list[socket.socket]]:
        """(admitted, connections to evict to make room): full only when every slot is authenticated."""
        with self._lock:
            reading = sorted((c.deadline, id(s), s) for s, c in self._open.items() if c.state == READING)
            over = max(len(reading) + 1 - self.max_unauthenticated, len(self._open) + 1 - self.max_connections, 0)
            if over > len(reading):
                return False, []
            victims = [s for _, _, s in reading[:over]]
            for victim in victims:
                self._open[victim].state = DROPPED
            self.evicted += len(victims)
            self._open[sock] = _Connection(READING, time.monotonic() + self.request_timeout_s)
            return True, victims

    def _move(self, sock: socket.socket, state: str, deadline: float | None = None) -> bool:
        with self._lock:
            conn = self._open.get(sock)
            if conn is None or conn.state == DROPPED:
                return False
            conn.state = state
            if deadline is not None:
                conn.deadline = deadline
            return True

    def request_started(self, sock: socket.socket) -> None:
        self._move(sock, READING, time.monotonic() + self.request_timeout_s)

    def request_authenticated(self, sock: socket.socket) -> bool:
        return self._move(sock, AUTHENTICATED)

    def request_received(self, sock: socket.socket) -> None:
        self._move(sock, RUNNING, float("inf"))

    def remove(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)

    def late(self) -> list[socket.socket]:
        """Connections whose request did not arrive whole in time (marked dropped)."""
        now = time.monotonic()
        with self._lock:
            late = [s for s, c in self._open.items() if c.state in (READING, AUTHENTICATED) and c.deadline < now]
            for sock in late:
                self._open[sock].state = DROPPED
            self.expired += len(late)
        return late

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def http_answer(status: int, reason: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def drop(sock: socket.socket, answer: bytes) -> None:
    """Answer without blocking (a slow client may read nothing) and cut the connection: its handler thread's read
    returns at once and the thread ends."""
    try:
        sock.send(answer, socket.MSG_DONTWAIT)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


__all__ = ["ConnectionTable", "drop", "http_answer"]
