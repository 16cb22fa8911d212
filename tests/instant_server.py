"""An instant llama-server stand-in for long runs: answers every `POST /completion` at once with one
canned non-stream response (keep-alive), counts them, and tells the count at `GET /count`.
`GET /health` and `/props` answer as llama-server's do, enough for a sweep to start.

    python tests/instant_server.py PORT      (started by servers.InstantServer)
"""

from __future__ import annotations

import asyncio
import json
import sys

COMPLETION = json.dumps({
    "content": " the quick brown fox", "stop": True, "stop_type": "limit", "tokens_predicted": 16, "id_slot": 0,
    "timings": {"prompt_n": 12, "prompt_ms": 1.5, "predicted_n": 16, "predicted_ms": 9.5,
                "predicted_per_second": 1684.2, "cache_n": 0}}).encode()
PROPS = json.dumps({"total_slots": 64, "model_alias": "instant", "build_info": "instant",
                    "default_generation_settings": {"n_ctx": 4096}}).encode()


def response(body: bytes, status: bytes = b"200 OK") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


ANSWERS = {b"/completion": response(COMPLETION), b"/health": response(b'{"status":"ok"}'),
           b"/props": response(PROPS)}


class Instant(asyncio.Protocol):
    count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        out = []
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = self.buffer[:head_end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < head_end + 4 + length:
                break
            self.buffer = self.buffer[head_end + 4 + length:]
            path = head.split(b" ", 2)[1]
            if path == b"/completion":
                Instant.count += 1
            answer = ANSWERS.get(path)
            if path == b"/count":
                answer = response(str(Instant.count).encode())
            out.append(answer or response(b'{"error":"not found"}', b"404 Not Found"))
        if out:
            self.transport.write(b"".join(out))


async def main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Instant, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1])))
