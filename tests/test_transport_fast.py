"""The fast transport against a fixture server that writes every byte as the test says."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from httpfixture import RawHttpServer, Request, chunked, reset, response, self_signed_tls, write_in_pieces
from loadgen.client.aiohttp_transport import AiohttpTransport
from loadgen.client.fast import FastTransport
from loadgen.client.registry import environment_proxy, make_transport
from loadgen.client.transport import TransportError
from loadgen.core import records
from servers import refused_port

TRANSPORTS = {"fast": FastTransport, "aiohttp": AiohttpTransport}
SSE = b"".join(b'data: {"content":"tok%d","stop":false}\n\n' % i for i in range(64))


def run(coro):
    return uvloop.run(coro)


async def _open(server: RawHttpServer, kind: str = "fast", timeout_s: float = 5.0, max_connections: int = 8,
                insecure: bool = False, close_streams: bool = True):
    transport = TRANSPORTS[kind]()
    await transport.open(server.url, max_connections, timeout_s, insecure=insecure, close_streams=close_streams)
    return transport


def answer(data: bytes, keep_open: bool = True):
    async def handler(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep_open
    return handler


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_keep_alive_requests_share_one_connection(kind):
    async def main():
        async def echo(request, writer):
            writer.write(response(request.body, headers=("X-Path: " + request.path,)))
            return True

        async with RawHttpServer(echo) as server:
            transport = await _open(server, kind)
            try:
                results = [await transport.request("POST", "/completion", b'{"n":%d}' % i) for i in range(5)]
            finally:
                await transport.close()
        assert [r.body for r in results] == [b'{"n":%d}' % i for i in range(5)]
        assert all(r.status == 200 and r.headers["x-path"] == "/completion" for r in results)
        assert all(r.headers_ns <= r.complete_ns for r in results)
        assert server.connections == 1
        first = server.requests[0]
        assert first.method == "POST" and first.headers["content-type"] == "application/json"
        assert first.headers["host"] == f"127.0.0.1:{server.port}"
    run(main())


def test_chunked_response_split_at_every_byte_boundary():
    body = b'data: {"content":"hello, world"}\n\n'
    data = chunked(body, [5, 1, 10], headers=("X-Trace: 1",))
    cuts = [cut for cut in range(1, len(data)) for _ in ("plain", "streamed")]

    async def main():
        async def split(request, writer):
            await write_in_pieces(writer, data, [cuts[len(server.requests) - 1]], pause_s=0.001)
            return True

        async with RawHttpServer(split) as server:
            transport = await _open(server)
            try:
                for _ in range(len(cuts) // 2):
                    r = await transport.request("POST", "/completion", b"{}")
                    assert (r.status, r.body, r.headers["x-trace"]) == (200, body, "1")
                    pieces: list[bytes] = []
                    r = await transport.request("POST", "/completion", b"{}", on_chunk=lambda c, t, pieces=pieces: pieces.append(c))
                    assert (r.status, r.body, b"".join(pieces)) == (200, b"", body)
            finally:
                await transport.close()
        # a plain request's connection is reused by the next request; a streamed one's is not
        assert server.connections == len(cuts) // 2
    run(main())


def test_streamed_body_arrives_per_read_with_times_and_intact():
    async def main():
        cuts = list(range(7, len(SSE), 97))  # cuts inside lines, inside "data:", between events

        async def stream(request, writer):
            await write_in_pieces(writer, chunked(SSE, [40, 300, 1000], headers=("Content-Type: text/event-stream",)),
                                  cuts)
            return True

        async with RawHttpServer(stream) as server:
            transport = await _open(server)
            chunks: list[tuple[bytes, int]] = []
            try:
                r = await transport.request("POST", "/completion", b"{}", on_chunk=lambda c, t: chunks.append((c, t)))
            finally:
                await transport.close()
        assert r.status == 200 and r.body == b"" and r.headers["content-type"] == "text/event-stream"
        assert b"".join(c for c, _ in chunks) == SSE
        assert len(chunks) > 10  # one call per read, not one per body
        times = [t for _, t in chunks]
        assert times == sorted(times) and r.headers_ns <= times[0] and times[-1] <= r.complete_ns
    run(main())


def test_connection_close_response_then_a_new_connection():
    async def main():
        async with RawHttpServer(answer(response(b"bye", headers=("Connection: close",)), keep_open=False)) as server:
            transport = await _open(server)
            try:
                results = [await transport.request("POST", "/x", b"{}") for _ in range(3)]
            finally:
                await transport.close()
        assert [r.body for r in results] == [b"bye"] * 3
        assert server.connections == 3
    run(main())


def test_body_delimited_by_the_close_of_the_connection():
    async def main():
        async with RawHttpServer(answer(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", keep_open=False)) as server:
            transport = await _open(server)
            try:
                r = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert (r.status, r.body) == (200, b"until the end")
    run(main())


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_reset_mid_body_is_disconnected(kind):
    async def main():
        async def half(request, writer):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40)
            await writer.drain()
            await asyncio.sleep(0.02)
            reset(writer)
            return False

        async with RawHttpServer(half) as server:
            transport = await _open(server, kind)
            try:
                with pytest.raises(TransportError) as err:
                    await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert err.value.kind == records.DISCONNECTED
        return err.value.message
    message = run(main())
    if kind == "fast":
        assert message == "the server reset the connection mid-body"


def test_interim_100_continue_is_skipped():
    async def main():
        async def cont(request, writer):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)
            writer.write(response(b"final", headers=("X-Final: yes",)))
            return True

        async with RawHttpServer(cont) as server:
            transport = await _open(server)
            try:
                r = await transport.request("POST", "/x", b"{}")
                again = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert (r.status, r.body, r.headers["x-final"]) == (200, b"final", "yes")
        assert "x-final" in again.headers and server.connections == 1
    run(main())


def test_204_has_no_body_and_keeps_the_connection():
    async def main():
        async with RawHttpServer(answer(b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n")) as server:
            transport = await _open(server)
            try:
                results = [await transport.request("POST", "/x", b"{}") for _ in range(3)]
            finally:
                await transport.close()
        assert [(r.status, r.body) for r in results] == [(204, b"")] * 3
        assert server.connections == 1
    run(main())


@pytest.mark.parametrize("encoding", ["length", "chunked"])
def test_bodies_over_one_mib_both_ways(encoding):
    big = bytes(range(256)) * (5 * 4096 + 7)  # 5 MiB + 1792 B

    async def main():
        async def echo(request, writer):
            writer.write(response(request.body) if encoding == "length" else chunked(request.body, [65536] * 40))
            await writer.drain()
            return True

        async with RawHttpServer(echo) as server:
            transport = await _open(server)
            try:
                r = await transport.request("POST", "/x", big)
                small = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert r.body == big and small.body == b"{}" and server.connections == 1
    run(main())


def test_server_that_answers_before_reading_the_whole_body():
    big = b"x" * (8 * 1024 * 1024)

    async def main():
        async def refuse(request, writer):
            writer.write(response(b"too large", "413 Payload Too Large", ("Connection: close",)))
            await writer.drain()
            return False

        async with RawHttpServer(refuse, read_body=False) as server:
            transport = await _open(server)
            try:
                r = await transport.request("POST", "/x", big)
                server.handler = answer(response(b"fine"))
                server.read_body = True
                after = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert (r.status, r.body) == (413, b"too large")
        assert (after.status, after.body) == (200, b"fine") and server.connections == 2
    run(main())


def test_idle_keep_alive_closed_by_the_server_is_no_error():
    async def main():
        async with RawHttpServer(answer(response(b"one"), keep_open=False)) as server:  # FIN after each answer
            transport = await _open(server)
            try:
                first = await transport.request("POST", "/x", b"{}")
                await asyncio.sleep(0.05)  # the FIN arrives while the connection is idle
                second = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert first.body == second.body == b"one" and server.connections == 2
    run(main())


def test_keep_alive_closed_as_the_next_request_arrives_is_an_error_not_a_retry():
    """The server read the request and closed without a byte. It may be the race with a closing
    keep-alive connection, or a server dropping requests: a retry cannot tell, and would hide the
    second. So it is recorded, and the request is not sent again."""
    async def main():
        async def close_second(request, writer):
            if request.index_on_connection == 1:
                return False
            writer.write(response(b"ok"))
            return True

        async with RawHttpServer(close_second) as server:
            transport = await _open(server)
            try:
                first = await transport.request("POST", "/x", b"{}")
                with pytest.raises(TransportError) as err:
                    await transport.request("POST", "/x", b"{}")
                third = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert first.body == third.body == b"ok"
        assert err.value.kind == records.DISCONNECTED and "before the response" in err.value.message
        assert server.connections == 2 and len(server.requests) == 3  # nothing sent twice
    run(main())


def test_a_streamed_request_asks_for_connection_close():
    async def main():
        async with RawHttpServer(answer(response(b"data: {}\n\n"))) as server:
            transport = await _open(server)
            try:
                await transport.request("POST", "/x", b"{}", on_chunk=lambda c, t: None)
                await transport.request("POST", "/x", b"{}", on_chunk=lambda c, t: None)
                await transport.request("POST", "/x", b"{}")
                await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        closes = [r.headers.get("connection") for r in server.requests]
        assert closes == ["close", "close", None, None]
        assert server.connections == 3  # one per stream, then one kept alive for both plain requests
    run(main())


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_streams_keep_the_connection_for_servers_that_keep_it(kind):
    # Only llama-server closes after a stream; elsewhere a stream's connection is reused like any.
    async def main():
        async with RawHttpServer(answer(response(b"data: {}\n\n"))) as server:
            transport = await _open(server, kind, close_streams=False)
            try:
                for _ in range(3):
                    await transport.request("POST", "/x", b"{}", on_chunk=lambda c, t: None)
            finally:
                await transport.close()
        assert [r.headers.get("connection") for r in server.requests] == [None] * 3
        assert server.connections == 1
    run(main())


def test_a_new_connection_closed_without_answer_is_an_error():
    async def main():
        async with RawHttpServer(answer(b"", keep_open=False)) as server:
            transport = await _open(server)
            try:
                with pytest.raises(TransportError) as err:
                    await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert err.value.kind == records.DISCONNECTED and server.connections == 1  # no retry on a fresh one
        assert "before the response" in err.value.message
    run(main())


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_total_timeout(kind):
    async def main():
        async def slow(request, writer):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await asyncio.sleep(5)
            return False

        async with RawHttpServer(slow) as server:
            transport = await _open(server, kind, timeout_s=0.2)
            try:
                with pytest.raises(TransportError) as err:
                    await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert err.value.kind == records.TIMEOUT
    run(main())


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_connection_refused_is_connect_error(kind):
    async def main():
        transport = TRANSPORTS[kind]()
        await transport.open(f"http://127.0.0.1:{port}", 1, 5)
        try:
            with pytest.raises(TransportError) as err:
                await transport.request("POST", "/x", b"{}")
        finally:
            await transport.close()
        assert err.value.kind == records.CONNECT_ERROR and "\n" not in err.value.message
        return err.value.message
    with refused_port() as port:  # a server just stopped frees its port for anyone to listen on
        message = run(main())
    assert "refused" in message.lower()


def test_malformed_response_is_disconnected():
    async def main():
        async with RawHttpServer(answer(b"HTTP/1.1 abc nonsense\r\n\r\n")) as server:
            transport = await _open(server)
            try:
                with pytest.raises(TransportError) as err:
                    await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        assert err.value.kind == records.DISCONNECTED and "invalid HTTP response" in err.value.message
    run(main())


def test_pool_holds_at_most_max_connections():
    async def main():
        async def slow(request, writer):
            await asyncio.sleep(0.01)
            writer.write(response(b"ok"))
            return True

        async with RawHttpServer(slow) as server:
            transport = await _open(server, max_connections=3)
            try:
                results = await asyncio.gather(*(transport.request("POST", "/x", b"{}") for _ in range(20)))
            finally:
                await transport.close()
        assert all(r.body == b"ok" for r in results)
        assert server.max_open_connections <= 3 and server.connections == 3
    run(main())


def test_cancelled_request_closes_its_connection():
    async def main():
        async def never(request, writer):
            await asyncio.sleep(5)
            return False

        async with RawHttpServer(never) as server:
            transport = await _open(server, max_connections=1)
            try:
                task = asyncio.ensure_future(transport.request("POST", "/x", b"{}"))
                await asyncio.sleep(0.05)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                server.handler = answer(response(b"ok"))
                r = await transport.request("POST", "/x", b"{}")  # the one slot is free again
            finally:
                await transport.close()
        assert r.body == b"ok" and server.connections == 2
    run(main())


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_tls_self_signed_needs_insecure(kind, tmp_path):
    context, _ = self_signed_tls(tmp_path)

    async def main():
        async with RawHttpServer(answer(response(b"secret")), tls=context) as server:
            transport = await _open(server, kind, insecure=True)
            try:
                ok = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
            transport = await _open(server, kind)
            try:
                with pytest.raises(TransportError) as err:
                    await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
        return ok, err.value
    ok, err = run(main())
    assert (ok.status, ok.body) == (200, b"secret")
    assert err.kind == records.CONNECT_ERROR
    assert "certificate verification failed" in err.message and "--insecure" in err.message


def test_environment_proxy_falls_back_to_aiohttp(monkeypatch):
    said: list[str] = []
    monkeypatch.setenv("http_proxy", "http://user:pw@proxy.example:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert isinstance(make_transport("fast", "http://10.1.2.3:8080", said.append), AiohttpTransport)
    assert len(said) == 1 and "proxy" in said[0] and "pw" not in said[0] and "10.1.2.3:8080" in said[0]
    assert isinstance(make_transport("fast", "http://127.0.0.1:8080", said.append), FastTransport)
    assert isinstance(make_transport("fast", "http://[::1]:8080", said.append), FastTransport)
    assert isinstance(make_transport("fast", "http://localhost:8080", said.append), FastTransport)
    monkeypatch.setenv("no_proxy", "10.1.2.3")
    assert environment_proxy("http://10.1.2.3:8080") is None
    assert isinstance(make_transport("fast", "http://10.1.2.3:8080", said.append), FastTransport)
    assert isinstance(make_transport("aiohttp", "http://10.1.2.3:8080"), AiohttpTransport)
    assert len(said) == 1


COMPLETION = (b'{"content":"hi","tokens_predicted":4,"stop_type":"limit","id_slot":0,"timings":{"prompt_n":5,'
              b'"prompt_ms":1.0,"predicted_n":4,"predicted_ms":2.0,"predicted_per_second":2000.0,"cache_n":0}}')


class ThreadedServer:
    """A RawHttpServer on its own event loop in a thread, for the CLI (which runs its own loop)."""

    def __init__(self, handler, tls=None):
        import threading

        self._server = RawHttpServer(handler, tls=tls)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self):
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        async with self._server:
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> RawHttpServer:
        self._thread.start()
        self._ready.wait(10)
        return self._server

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def llama_answering(body: bytes, *headers: str):
    """A handler that answers /completion with `body` (and these headers), /health ok, else 404."""
    async def handler(request, writer):
        if request.path == "/completion":
            writer.write(response(body, headers=headers))
        elif request.path == "/health":
            writer.write(response(b'{"status":"ok"}'))
        else:
            writer.write(response(b"not here", "404 Not Found"))
        await writer.drain()
        return True
    return handler


llama_like = llama_answering(COMPLETION, "Content-Type: application/json")


@pytest.mark.parametrize("transport", ["fast", "aiohttp"])
def test_sweep_over_https_needs_insecure_for_a_self_signed_certificate(loadgen, tmp_path, transport):
    from loadgen.results.reader import load_records, load_run_dict

    context, _ = self_signed_tls(tmp_path)
    with ThreadedServer(llama_like, tls=context) as server:
        args = ["sweep", "--url", server.url, "--concurrency", "1,2", "--requests", "3", "--warmup", "1",
                "--transport", transport, "--no-histograms", "--wait-ready", "1"]
        code, _, err = loadgen(*args, "--output", tmp_path / "refused")
        assert code == 1
        assert "certificate verification failed" in err and "--insecure" in err
        code, _, err = loadgen(*args, "--insecure", "--output", tmp_path / "ok")
        assert code == 0, err
    doc = load_run_dict(tmp_path / "ok")
    assert doc["config"]["transport"] == transport and doc["config"]["insecure"] is True
    assert doc["targets"][0]["read_clock"] == "loop"  # TLS reads are timed by the loop
    assert [lv["requests_ok"] for lv in doc["targets"][0]["levels"]] == [3, 3]
    assert all(r.ok and r.predicted_n == 4 for r in load_records(tmp_path / "ok"))


# llama-server's stream: its final event carries `timings` (chat's turns are read by sweep's backend,
# which records a final event without them as invalid_json)
STREAM = (b'data: {"content":"hi","stop":false}\n\n'
          b'data: {"content":"","stop":true,"tokens_predicted":1,"stop_type":"limit","id_slot":0,'
          b'"timings":{"prompt_n":4,"prompt_ms":1.0,"predicted_n":1,"predicted_ms":1.0,"cache_n":0}}\n\n')


llama_streaming = llama_answering(STREAM, "Content-Type: text/event-stream", "Connection: close")


def test_chat_over_https_honours_insecure(loadgen, tmp_path):
    """chat's turns are sent with --insecure's TLS settings, as sweep's: a self-signed certificate is
    accepted with it (the turns failed on certificate verification before, --insecure or not)."""
    from loadgen.results.reader import load_records

    context, _ = self_signed_tls(tmp_path)
    with ThreadedServer(llama_streaming, tls=context) as server:
        args = ["chat", "--url", server.url, "--users", "1", "--turns", "2", "--message-tokens", "4",
                "--n-predict", "1", "--wait-ready", "1"]
        code, _, err = loadgen(*args, "--insecure", "--output", tmp_path / "ok")
        assert code == 0, err
    records = load_records(tmp_path / "ok")
    assert len(records) == 2 and all(r.ok for r in records), records


@pytest.mark.skipif(__import__("sys").platform != "linux", reason="kernel receive stamps are Linux's")
@pytest.mark.parametrize("transport,clock", [("fast", "kernel"), ("aiohttp", "loop")])
def test_run_json_says_how_reads_were_timed(loadgen, tmp_path, transport, clock):
    from loadgen.results.reader import load_run_dict

    with ThreadedServer(llama_like) as server:
        code, _, err = loadgen("sweep", "--url", server.url, "--concurrency", "1", "--requests", "2", "--warmup", "0",
                               "--transport", transport, "--no-histograms", "--wait-ready", "1",
                               "--output", tmp_path / "run")
    assert code == 0, err
    assert load_run_dict(tmp_path / "run")["targets"][0]["read_clock"] == clock


def test_unknown_transport_is_a_usage_error(loadgen):
    code, _, err = loadgen("sweep", "--ports", "1", "--transport", "curl")
    assert code == 2 and "fast" in err and "aiohttp" in err


OK_JSON = response(b'{"ok":true}')


def _thread_server(script=((OK_JSON, False),), answered=None):
    """A server in its own thread (so a blocked event loop cannot hold it up). Request i on a
    connection is answered at once with script[i] = (bytes, reset): reset closes the connection
    with a RST right behind the bytes. Past the script's end, its last entry. Returns (url, stop,
    connections), `connections` a list that grows by one per accepted connection. `answered`, a
    threading.Semaphore, is released once per answer, once its bytes (and RST) are in the client's socket."""
    import socket
    import struct
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    connections: list[int] = []

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            connections.append(1)
            with conn:
                conn.settimeout(0.2)
                buf, index = b"", 0
                while not stop.is_set():
                    try:
                        data = conn.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    buf += data
                    if b"\r\n\r\n" not in buf:
                        continue
                    buf = buf.partition(b"\r\n\r\n")[2][2:]  # bodies here are "{}" (Content-Length: 2)
                    reply, reset = script[min(index, len(script) - 1)]
                    index += 1
                    conn.sendall(reply)
                    if reset:  # SO_LINGER 0: the close sends a RST
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        conn.close()
                    if answered is not None:
                        answered.release()
                    if reset:
                        break
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", lambda: (stop.set(), thread.join(5)), connections


def _block_until_answered(answered, n=2):
    """Block the loop until the server thread sent its n-th answer (a fixed sleep would hope that a
    thread on a busy machine got to it in time). One request went before the blocked one: n=2."""
    for _ in range(n):
        assert answered.acquire(timeout=10), "the server thread did not answer"


async def _while_the_loop_is_blocked(transport, answered, seconds=0.3):
    """A request on an idle connection whose answer (and what follows) arrives while the loop is busy:
    blocked until it arrived, and `seconds` more."""
    import time

    pending = asyncio.ensure_future(transport.request("POST", "/x", b"{}"))
    await asyncio.sleep(0)  # its first step writes the request
    _block_until_answered(answered)
    time.sleep(seconds)
    return await pending


def test_a_reset_that_arrives_with_half_a_body_is_disconnected_not_a_hang():
    """uvloop (libuv) reports a socket error once, with the bytes before it, then stops watching."""
    half = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40
    import threading

    answered = threading.Semaphore(0)
    url, stop, _ = _thread_server([(OK_JSON, False), (half, True)], answered)

    async def main():
        transport = FastTransport()
        await transport.open(url, 1, 5.0)
        try:
            await transport.request("POST", "/x", b"{}")  # connected, now idle
            await _while_the_loop_is_blocked(transport, answered)
        except TransportError as exc:
            return exc
        finally:
            await transport.close()

    try:
        error = uvloop.run(asyncio.wait_for(main(), 4))  # a hang would wait for the 5 s timeout
    finally:
        stop()
    assert isinstance(error, TransportError) and error.kind == records.DISCONNECTED
    assert "reset the connection mid-body" in error.message


def test_a_reset_right_behind_a_whole_response_retires_the_connection():
    import threading

    answered = threading.Semaphore(0)
    url, stop, connections = _thread_server([(OK_JSON, False), (OK_JSON, True)], answered)

    async def main():
        transport = FastTransport()
        await transport.open(url, 1, 5.0)
        try:
            await transport.request("POST", "/x", b"{}")  # connected, now idle
            blocked = await _while_the_loop_is_blocked(transport, answered, 0.1)
            return blocked, await transport.request("POST", "/x", b"{}")
        finally:
            await transport.close()

    try:
        blocked, after = uvloop.run(asyncio.wait_for(main(), 4))
    finally:
        stop()
    assert blocked.status == 200 and after.status == 200 and after.body == b'{"ok":true}'
    assert len(connections) == 2  # the reset one was not used again


@pytest.mark.skipif(__import__("sys").platform != "linux", reason="kernel receive stamps are Linux's")
@pytest.mark.parametrize("kernel_stamps", [True, False])
def test_a_read_is_timed_when_it_arrived_not_when_a_busy_loop_got_to_it(kernel_stamps):
    """The answer arrives while the loop is blocked, which stays blocked 300 ms more: the kernel's
    stamp says when it came."""
    import threading
    import time

    from loadgen.core.clock import now_ns

    answered = threading.Semaphore(0)
    url, stop, _ = _thread_server(answered=answered)

    async def main():
        transport = FastTransport(kernel_stamps=kernel_stamps)
        await transport.open(url, 1, 5.0)
        try:
            await transport.request("POST", "/x", b"{}")  # connect first: the next request is one write
            sent = now_ns()
            pending = asyncio.ensure_future(transport.request("POST", "/x", b"{}"))
            await asyncio.sleep(0)  # its first step writes the request
            _block_until_answered(answered)
            arrived = now_ns()  # the answer is in the socket by now
            time.sleep(0.3)  # the loop is busy; the answer waits in the socket
            r = await pending
            assert sent < r.headers_ns <= r.complete_ns
            return (r.headers_ns - arrived) / 1e6, (r.complete_ns - arrived) / 1e6
        finally:
            await transport.close()

    try:
        headers_ms, complete_ms = run(main())
    finally:
        stop()
    print(f"headers {headers_ms:.3f} ms, complete {complete_ms:.3f} ms after the answer was in the socket")
    if kernel_stamps:  # stamped on arrival, before the test saw the server had sent it (less clock noise)
        assert headers_ms < 10 and complete_ms < 10
    else:
        assert headers_ms >= 300 and complete_ms >= 300


def test_implausible_kernel_stamps_fall_back_to_the_read_time():
    import socket
    import struct
    import time

    from loadgen.client.connections import SO_TIMESTAMPNS, kernel_time
    from loadgen.core.clock import now_ns

    def anc(ns):
        return [(socket.SOL_SOCKET, SO_TIMESTAMPNS, struct.pack("qq", ns // 10**9, ns % 10**9))]

    before = now_ns()
    wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
    t = kernel_time(anc(wall - 5_000_000))  # arrived 5 ms before `wall` was read
    assert before - 5_000_000 - 1_000_000 < t <= now_ns() - 5_000_000
    for implausible in (anc(wall + 10**9), anc(wall - 3600 * 10**9), [(socket.SOL_SOCKET, 99, b"x" * 16)]):
        # from the future or an hour old (a clock step), or another message: dated now
        start = now_ns()
        assert start <= kernel_time(implausible) <= now_ns()


def test_the_clock_pair_is_read_as_one_moment():
    """The wall and monotonic readings that convert a kernel stamp are taken together, whatever the
    machine's load: their offset agrees with a reading bracketed here, to within the bracket."""
    import time

    from loadgen.client.connections import clock_pair
    from loadgen.core.clock import now_ns

    for _ in range(200):
        mono, real = clock_pair()
        before = now_ns()
        wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = now_ns()
        if after - before > 20_000:
            continue  # this reading was preempted; clock_pair's own would have been retried
        # the same offset (wall - monotonic) both ways, to within our bracket and clock_pair's 20 µs
        assert abs((real - mono) - (wall - (before + after) // 2)) <= (after - before) + 20_000


def test_a_host_name_is_resolved_once_and_its_working_address_tried_first():
    """"localhost" may resolve to ::1 first; the server listens on 127.0.0.1 only."""
    async def main():
        async with RawHttpServer(answer(response(b"ok", headers=("Connection: close",)), keep_open=False)) as server:
            transport = FastTransport()
            await transport.open(f"http://localhost:{server.port}", 2, 5.0)
            try:
                results = [await transport.request("POST", "/x", b"{}") for _ in range(3)]
                addrs = list(transport._addrs)
            finally:
                await transport.close()
            return results, addrs, server.connections

    results, addrs, connections = run(main())
    assert [r.body for r in results] == [b"ok"] * 3 and connections == 3
    assert addrs[0][1][0] == "127.0.0.1"


def test_a_reset_never_ends_a_body_delimited_by_the_close():
    url, stop, _ = _thread_server([(b"HTTP/1.1 200 OK\r\n\r\npart of a body", True)])

    async def main():
        transport = FastTransport()
        await transport.open(url, 1, 5.0)
        try:
            await transport.request("POST", "/x", b"{}")
        except TransportError as exc:
            return exc
        finally:
            await transport.close()

    try:
        error = uvloop.run(asyncio.wait_for(main(), 4))
    finally:
        stop()
    assert isinstance(error, TransportError) and error.kind == records.DISCONNECTED
    assert error.message == "the server reset the connection mid-body"


def test_concurrent_connects_skip_an_address_that_refuses():
    """The target's first address refuses (as ::1 does for a server on 127.0.0.1 only): eight
    connects at once each go on to the next address, none fails, and the working one goes first."""
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
    refused = ("127.0.0.1", closed.getsockname()[1])

    async def main():
        async with RawHttpServer(answer(response(b"ok"))) as server:
            transport = FastTransport()
            await transport.open(server.url, 8, 5.0)
            working = ("127.0.0.1", server.port)
            transport._addrs = [(socket.AF_INET, refused), (socket.AF_INET, working)]
            try:
                results = await asyncio.gather(*(transport.request("POST", "/x", b"{}") for _ in range(8)))
                return results, transport._addrs, working
            finally:
                await transport.close()

    try:
        results, addrs, working = run(main())
    finally:
        closed.close()
    assert [r.body for r in results] == [b"ok"] * 8
    assert addrs == [(socket.AF_INET, working), (socket.AF_INET, refused)]
