"""A raw HTTP/1.1 server on 127.0.0.1 whose answers a test writes byte by byte.

Each request is read (head, then a Content-Length body unless `read_body` is False) and handed to
`handler(request, writer)`, which writes whatever bytes it likes and returns True to keep the
connection open for the next request or False to close it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    connection: int  # which connection (0, 1, ...) it came on
    index_on_connection: int  # 0 for the first request on its connection


Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class RawHttpServer:
    """`async with RawHttpServer(handler) as server:` listening at `server.url` (named apart from
    fixture_server.FixtureServer, the llama-like one that answers by a `Behaviour`)."""

    handler: Handler
    tls: ssl.SSLContext | None = None
    read_body: bool = True
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    open_connections: int = 0
    max_open_connections: int = 0

    async def __aenter__(self) -> RawHttpServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        self._tasks: set[asyncio.Task] = set()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        number = self.connections
        self.connections += 1
        self.open_connections += 1
        self.max_open_connections = max(self.max_open_connections, self.open_connections)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for index in range(1_000_000):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in
                           (line.split(":", 1) for line in lines[1:] if line)}
                body = b""
                if self.read_body:
                    body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, path, headers, body, number, index)
                self.requests.append(request)
                if not await self.handler(request, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # swallowing the cancel at teardown keeps asyncio from logging it as an error
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            if not writer.is_closing():
                writer.close()


async def write_in_pieces(writer: asyncio.StreamWriter, data: bytes, cuts: list[int], pause_s: float = 0.002) -> None:
    """Write `data` split at `cuts`, pausing between pieces so the client sees separate reads."""
    start = 0
    for cut in [*cuts, len(data)]:
        if cut > start:
            writer.write(data[start:cut])
            await writer.drain()
            if cut < len(data):
                await asyncio.sleep(pause_s)
        start = cut


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def response(body: bytes = b"ok", status: str = "200 OK", headers: tuple[str, ...] = ()) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def chunked(body: bytes, sizes: list[int], status: str = "200 OK", headers: tuple[str, ...] = ()) -> bytes:
    """`body` in a chunked response, cut into chunks of the given sizes (the rest in a last chunk)."""
    extra = "".join(f"{h}\r\n" for h in headers)
    out = [f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n{extra}\r\n".encode()]
    start = 0
    for size in [*sizes, len(body)]:
        piece = body[start:start + size]
        if piece:
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        start += len(piece)
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def self_signed_tls(tmp_path) -> tuple[ssl.SSLContext, str]:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1 (and its PEM path)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loadgen test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, str(cert_path)
