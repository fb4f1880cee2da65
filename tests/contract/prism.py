"""Running Prism (``@stoplight/prism-cli``) as a mock of the patched spec, for the contract tests.

Prism is installed by ``.ci/prism-setup`` into the git-ignored ``.cache/prism``. Run as
``prism mock -h 127.0.0.1 -p <port> --errors <spec>`` (static answers from the spec's
examples), it answers a request that breaks the contract with 4xx (422, or the operation's
own 400/401) and, because of ``--errors``, a response of its own that breaks the schema with
500; every violation is also listed in the ``sl-violations`` header.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

__all__ = ["PRISM_ENV", "PrismServer", "find_prism", "free_port", "start_prism"]

REPO: Final = Path(__file__).resolve().parents[2]
#: Environment variable naming a Prism binary to use instead of ``.cache/prism``'s.
PRISM_ENV: Final = "HOOKLEDGER_PRISM"
_LOCAL_PRISM: Final = REPO / ".cache" / "prism" / "node_modules" / ".bin" / "prism"


def find_prism() -> Path | None:
    """``$HOOKLEDGER_PRISM``, else ``.cache/prism``'s binary, else ``prism`` on ``PATH``."""
    override = os.environ.get(PRISM_ENV)
    if override:
        return Path(override)
    if _LOCAL_PRISM.exists():
        return _LOCAL_PRISM
    found = shutil.which("prism")
    return Path(found) if found else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PrismServer:
    """A running ``prism mock`` child process (in a process group of its own)."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    _log: TextIO

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the group Prism leads, then SIGKILL it after ``timeout`` seconds."""
        try:
            if self.process.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.process.wait(timeout)
        finally:
            self._log.close()

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)  # the group we created: pgid == Prism's pid
        except ProcessLookupError:
            pass


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def start_prism(binary: Path, spec: Path, log_path: Path, timeout: float = 45.0) -> PrismServer:
    """Start ``prism mock --errors`` on a free port and wait until it accepts connections.

    Raises :class:`RuntimeError` (with the end of Prism's log) when Prism exits early or is
    not listening within ``timeout`` seconds; the process is stopped in both cases.
    """
    port = free_port()
    log = log_path.open("w", encoding="utf-8")
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    env.pop("NODE_ENV", None)  # NODE_ENV=production would fork a second (multiprocess) server
    process = subprocess.Popen(
        [str(binary), "mock", "-h", "127.0.0.1", "-p", str(port), "--errors", str(spec)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    server = PrismServer(process, f"http://127.0.0.1:{port}", log_path, log)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            tail = server.log_tail()
            server.stop()
            raise RuntimeError(f"prism exited with {process.returncode} while starting:\n{tail}")
        if _listening(port):
            return server
        if time.monotonic() > deadline:
            tail = server.log_tail()
            server.stop()
            raise RuntimeError(f"prism was not listening after {timeout:.0f} s:\n{tail}")
        time.sleep(0.1)
