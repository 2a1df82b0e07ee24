"""The TLS listener: every fault under TLS, and ``tls_stall``, a handshake that never ends.

With ``FaultServer(tls=True)`` a second port serves HTTPS: the same requests, faults and
journal as the plain port, behind a self-signed certificate made at start (with the
``cryptography`` package when installed, else the ``openssl`` command) whose PEM a client
trusts through `FaultServer.tls_cert`. The listener accepts plain TCP and runs the
handshake itself (``StreamWriter.start_tls``, Python 3.11+), so that a connection-level
``tls_stall`` scenario can take a connection first: its ClientHello is read and never
answered, the classic hang of a TLS terminator that has gone away, until the fault's
``hold`` (at most ``max_hold``). A handshake is bounded by ``max_hold`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from ._catalogue import CONNECTION_BEHAVIOURS
from ._metrics import Flights
from ._scenarios import Scenarios
from ._wire_accept import Acceptor

__all__ = ["TLS_SUPPORTED", "TlsListener", "self_signed"]

logger = logging.getLogger("fault_server")

TLS_SUPPORTED = hasattr(asyncio.StreamWriter, "start_tls")  # Python 3.11+.
_STALL = frozenset({"tls_stall"})
_OPENSSL_TIMEOUT = 20.0  # bounds the openssl command, when cryptography is missing.
_SHUTDOWN = 0.5  # bounds how long close() waits for cancelled handshakes.

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def self_signed(host: str, directory: Path) -> tuple[Path, Path]:
    """Write a self-signed certificate for ``host`` (and ``localhost``) and its key.

    Returns the paths of the certificate and key PEM files.

    Raises:
        RuntimeError: if neither ``cryptography`` nor the ``openssl`` command is there, or
            the command fails.
    """
    cert, key = directory / "cert.pem", directory / "key.pem"
    try:
        _with_cryptography(host, cert, key)
    except ImportError:
        _with_openssl(host, cert, key)
    return cert, key


def _with_cryptography(host: str, cert_path: Path, key_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fault_server")])
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    with contextlib.suppress(ValueError):
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    now = datetime.datetime.now(datetime.timezone.utc)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _with_openssl(host: str, cert_path: Path, key_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "tls=True needs the 'cryptography' package or the 'openssl' command to make "
            "its certificate; neither is installed"
        )
    alt = "DNS:localhost"
    with contextlib.suppress(ValueError):
        alt += f",IP:{ipaddress.ip_address(host)}"
    command = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key_path), "-out", str(cert_path), "-days", "7",
        "-subj", "/CN=fault_server", "-addext", f"subjectAltName={alt}",
        "-addext", "basicConstraints=critical,CA:TRUE",
    ]  # fmt: skip
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=_OPENSSL_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"openssl could not make the TLS certificate: {exc}") from exc


class TlsListener:
    """A TCP listener that runs the TLS handshake itself, then hands the connection over.

    Args:
        host: the address to bind (port chosen by the kernel).
        scenarios: where a ``tls_stall`` rule is taken from.
        max_hold: bounds a handshake and a stall.
        serve: what serves a connection once its handshake is done.
        flights: where a stalled handshake is counted (``GET /metrics``).
    """

    def __init__(
        self, host: str, scenarios: Scenarios, max_hold: float, serve: Handler, flights: Flights
    ) -> None:
        if not TLS_SUPPORTED:
            raise RuntimeError("the TLS listener needs Python 3.11+ (StreamWriter.start_tls)")
        self._host = host
        self._scenarios = scenarios
        self._flights = flights
        self._max_hold = max_hold
        self._serve = serve
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._context: ssl.SSLContext | None = None
        self._server: Acceptor | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.cert: Path | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the TLS listener is not open")
        return self._server.port

    async def open(self, backlog: int, max_connections: int) -> None:
        """Make the certificate (off the loop) and listen, serving at most
        ``max_connections`` at once (see `Acceptor`)."""
        self._dir = tempfile.TemporaryDirectory(prefix="fault_server_tls_")
        cert, key = await anyio.to_thread.run_sync(self_signed, self._host, Path(self._dir.name))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._context, self.cert = context, cert
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.create_server((self._host, 0), family=family, backlog=backlog)
        self._server = Acceptor(sock, self._on_connect, max_connections)
        self._server.start()

    async def close(self) -> None:
        """Stop listening, end the handshakes and stalls under way, delete the files."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_SHUTDOWN)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is None or self._context is None:
            writer.transport.abort()
            return
        self._tasks.add(task)
        try:
            shaken = await self._handshake(reader, writer, self._context)
        except asyncio.CancelledError:  # only close() cancels us; end quietly (see _server).
            writer.transport.abort()
            return
        finally:
            self._tasks.discard(task)
        if shaken:
            await self._serve(reader, writer)
        else:
            writer.transport.abort()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext
    ) -> bool:
        """True once the handshake is done; False after a stall, a timeout or a TLS error."""
        rule = self._scenarios.take_connection(_STALL)
        if rule is not None:
            stall = CONNECTION_BEHAVIOURS[rule.spec.name]
            with self._flights.holding(rule.spec.name):
                return await stall(reader, writer, rule.spec, self._max_hold)
        try:
            with anyio.fail_after(self._max_hold):
                await writer.start_tls(context)  # type: ignore[attr-defined]  # 3.11+
        except (TimeoutError, ssl.SSLError, ConnectionError, OSError) as exc:
            logger.debug("fault_server: TLS handshake failed: %r", exc)
            return False
        return True
