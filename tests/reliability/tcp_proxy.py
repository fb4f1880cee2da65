"""A small threaded TCP proxy on loopback that can cut and restore a database link.

::

    with TcpProxy("127.0.0.1", 5432) as proxy:     # listens on 127.0.0.1:proxy.port
        proxy.cut()                                # close every link, refuse new ones
        proxy.cut(mode="reset")                    # close every link, reset new ones
        proxy.cut(mode="blackhole")                # close every link, accept new ones, never answer
        proxy.cut(mode="stall")                    # keep every link, forward nothing either way
        proxy.restore()

``refuse`` is a database server that is down (connections are refused at once); ``reset`` is
a server that drops new connections at once (and lets the test count the attempts in
``reset``); ``blackhole`` is a network partition (the TCP handshake succeeds, then nothing
ever comes back); ``stall`` is a hung server or proxy in between: every open link stays
open and every byte sent on it is read and dropped, new connections are accepted and treated
alike (TCP acknowledges, keepalives are answered, nothing ever comes back). ``restore`` after
a stall answers new connections again, but the links that were stalled stay stalled: the
bytes they lost leave their protocol state unknown, as with a real hung proxy, so only a
client-side bound gets their user out.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Literal

CutMode = Literal["refuse", "reset", "blackhole", "stall"]


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = 0
        self._lock = threading.Lock()
        self._mode: CutMode | None = None
        self._links: set[socket.socket] = set()  # every socket of every live link
        self._held: set[socket.socket] = set()  # blackholed client sockets
        self._stalled: set[socket.socket] = set()  # stalled sockets: read from, never sent to
        self._upstreams: set[socket.socket] = set()  # the server's side of each link
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._closed = False
        self.accepted = 0  # connections accepted
        self.reset = 0  # of which reset at once (cut in "reset" mode)

    def __repr__(self) -> str:
        return f"TcpProxy({self.host}:{self.port} -> {self.upstream[0]}:{self.upstream[1]})"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._listen()
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._stop_listening()
        self._drop_all()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults ---------------------------------------------------------------------------

    @property
    def is_cut(self) -> bool:
        return self._mode is not None

    def cut(self, mode: CutMode = "refuse") -> None:
        """Close every open link; then refuse (or blackhole) new connections until restore.
        ``stall``: keep the open links, but forward nothing on them from now on."""
        with self._lock:
            self._mode = mode
            if mode == "stall":
                self._stalled.update(self._links)
                return
        if mode == "refuse":
            self._stop_listening()
        self._drop_all()

    def restore(self) -> None:
        with self._lock:
            mode, self._mode = self._mode, None
            held, self._held = self._held, set()
        for sock in held:  # the partition heals: the half-open connections are reset
            _close(sock)
        if mode == "refuse":
            self._listen()

    # -- internals ------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:  # the same port again after a "refuse" cut
            try:
                listener.bind((self.host, self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    listener.close()
                    raise
                time.sleep(0.05)
        listener.listen(128)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._accepter = threading.Thread(
            target=self._accept_loop, args=(listener,), name="tcp-proxy-accept", daemon=True
        )
        self._accepter.start()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._accepter is not None:
            self._accepter.join(timeout=5)
            self._accepter = None

    def _drop_all(self) -> None:
        with self._lock:
            links, self._links = self._links, set()
            held = set(self._held) if self._closed else set()
            if self._closed:
                self._held = set()
        for sock in links | held:
            _close(sock)

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _addr = listener.accept()
            except OSError:
                return  # the listener was closed
            self.accepted += 1
            with self._lock:
                mode, closed = self._mode, self._closed
                if mode == "blackhole" and not closed:
                    self._held.add(client)
                    continue
                if mode == "stall" and not closed:
                    self._stalled.add(client)
                    self._links.add(client)
                    threading.Thread(
                        target=self._pump,
                        args=(client, client),
                        name="tcp-proxy-swallow",
                        daemon=True,
                    ).start()
                    continue
            if closed or mode is not None:
                self.reset += 1
                with contextlib.suppress(OSError):  # RST, not an orderly close
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._links.update((client, upstream))
                self._upstreams.add(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst), name="tcp-proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if src in self._stalled or dst in self._stalled:
                    continue  # swallowed
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                # A stalled link whose server side ends (its idle timeout, say) stays open
                # on the client's side, still swallowing: nothing comes back, not even EOF.
                keep = src in self._upstreams and dst in self._stalled and not self._closed
                self._links.discard(src)
                self._stalled.discard(src)
                self._upstreams.discard(src)
                if not keep:
                    self._links.discard(dst)
                    self._stalled.discard(dst)
                    self._upstreams.discard(dst)
            _close(src)
            if not keep:
                _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
