"""Any split of a valid HTTP response into reads parses to the same status, headers and body."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client.http_parser import ResponseParser

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
    lambda s: s.strip("-") and s.lower() not in ("content-length", "transfer-encoding", "connection"))
VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 /;=.,", max_size=30).map(str.strip)
STATUS = st.sampled_from([200, 201, 204, 400, 404, 429, 500, 503])


@st.composite
def responses(draw):
    """(wire bytes, status, headers, body, interim), with Content-Length, chunked or close framing."""
    status = draw(STATUS)
    headers = draw(st.lists(st.tuples(TOKEN, VALUE), max_size=6))
    body = b"" if status == 204 else draw(st.binary(max_size=600))
    framing = "none" if status == 204 else draw(st.sampled_from(["length", "chunked", "close"]))
    interim = draw(st.booleans())
    head = "".join(f"{k}: {v}\r\n" for k, v in headers)
    if framing == "length":
        head += f"Content-Length: {len(body)}\r\n"
        payload = body
    elif framing == "chunked":
        head += "Transfer-Encoding: chunked\r\n"
        sizes = draw(st.lists(st.integers(1, 200), max_size=8))
        out, start = [], 0
        for size in [*sizes, len(body)]:
            piece = body[start:start + size]
            if piece:
                out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
            start += len(piece)
        payload = b"".join(out) + b"0\r\n\r\n"
    else:
        head += "Connection: close\r\n" if framing == "close" else ""
        payload = body
    wire = (b"HTTP/1.1 100 Continue\r\n\r\n" if interim else b"") + \
        f"HTTP/1.1 {status} Whatever\r\n{head}\r\n".encode("latin-1") + payload
    return wire, status, headers, body, framing


def parse(wire: bytes, cuts: list[int], framing: str, streamed: bool):
    parser = ResponseParser()
    pieces: list[bytes] = []
    parser.start((lambda chunk, t: pieces.append(chunk)) if streamed else None)
    start = 0
    for t, cut in enumerate([*sorted(set(cuts)), len(wire)]):
        if cut > start:
            parser.feed(wire[start:cut], t)
        start = cut
    if framing == "close":
        assert not parser.complete
        assert parser.feed_eof(len(cuts) + 1)
    assert parser.complete
    body = b"".join(pieces) if streamed else parser.body()
    return parser.status, [(k, v) for k, v in parser.headers().items()], body


@settings(max_examples=300, deadline=None)
@given(responses(), st.data(), st.booleans())
def test_any_split_parses_to_the_same_response(response, data, streamed):
    wire, status, headers, body, framing = response
    cuts = data.draw(st.lists(st.integers(1, max(1, len(wire) - 1)), max_size=12))
    got_status, got_headers, got_body = parse(wire, cuts, framing, streamed)
    assert got_status == status
    assert got_body == body
    sent = [(k, v) for k, v in headers]
    assert got_headers[:len(sent)] == sent  # then the framing header


def test_every_two_way_split_of_a_chunked_response():
    body = b'data: {"content":"hi"}\n\ndata: {"stop":true}\n\n'
    wire = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\n" + body[:5] + b"\r\n" + b"%x\r\n" % (len(body) - 5) + body[5:] + b"\r\n0\r\n\r\n")
    for cut in range(1, len(wire)):
        for streamed in (False, True):
            assert parse(wire, [cut], "chunked", streamed) == (200, [("Transfer-Encoding", "chunked")], body)


def test_bytes_after_the_response_are_not_its_body():
    for extra in (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad", b"garbage"):
        parser = ResponseParser()
        parser.start(None)
        parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + extra, 1)
        assert (parser.complete, parser.body(), parser.extra_data) == (True, b"ok", True)
