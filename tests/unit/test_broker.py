"""The broker's HTTP framing and per-run rewrites (pure parts; tests/e2e/test_broker.py
runs the broker against the runner's real engine)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kooi.broker import BadRequest, Reader, Rules, RunScope, Upstream, read_body, read_head, stream_body


def reader(data: bytes) -> Reader:
    a, b = socket.socketpair()
    b.sendall(data)
    b.close()
    return Reader(a)


def test_a_request_head_is_parsed_and_the_body_left_for_later():
    r = reader(b"POST /v1.41/containers/create?name=x HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\n\r\n{}")
    req = read_head(r)
    assert (req.method, req.uri, req.length, req.chunked) == ("POST", "/v1.41/containers/create?name=x", 2, False)
    assert read_body(r, req, 100) == b"{}"


@pytest.mark.parametrize("head", [
    b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
    b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST /x HTTP/1.1\r\n folded: header\r\n\r\n",
    b"POST /x HTTP/1.1\r\nbad header\r\n\r\n",
    b"POST x HTTP/1.1\r\n\r\n",
    b"GET /x HTTP/2\r\n\r\n",
    b"GET /x HTTP/1.1\r\n" + b"X-A: " + b"a" * 70000 + b"\r\n\r\n",
])
def test_ambiguous_or_malformed_heads_are_refused(head):
    with pytest.raises(BadRequest):
        read_head(reader(head))


def test_chunked_bodies_are_read_whole_and_capped():
    raw = b"POST /containers/create HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n"
    r = reader(raw)
    req = read_head(r)
    assert req.chunked and read_body(r, req, 100) == b'{"a":1}'
    r = reader(raw)
    assert read_body(r, read_head(r), 5) is None


def test_a_streamed_body_is_relayed_exactly_and_no_further():
    raw = (b"PUT /containers/c/archive?path=/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n")
    r = reader(raw)
    req = read_head(r)
    out_a, out_b = socket.socketpair()
    stream_body(r, req, out_a)
    out_a.close()
    assert out_b.recv(1000) == b"5\r\nhello\r\n0\r\n\r\n"
    assert r.take().startswith(b"GET /smuggled")  # left unread, never forwarded


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_request_or_bad_request(data):
    try:
        req = read_head(reader(data))
    except BadRequest:
        return
    assert req.method.isupper() and req.uri.startswith("/")


def rules(**kw) -> Rules:
    scope = RunScope("run-1", {"org.kooi.run": "run-1"}, network="kooi-run-1",
                     socket_host_path="/var/lib/kooi/runs/brokers/b.sock",
                     path_map={"/workspace": "/srv/project"}, **kw)
    return Rules(scope, Upstream("/nonexistent"))


@pytest.mark.parametrize("src,host", [
    ("/workspace", "/srv/project"),
    ("/workspace/target/classes", "/srv/project/target/classes"),
    ("/workspaces/x", "/workspaces/x"),
    ("/run/kooi/docker.sock", "/var/lib/kooi/runs/brokers/b.sock"),
    ("/var/run/docker.sock", "/var/lib/kooi/runs/brokers/b.sock"),
    ("/etc", "/etc"),
])
def test_bind_sources_are_translated_to_host_paths(src, host):
    assert rules().host_path(src) == host


@pytest.mark.parametrize("query", ["", "all=1", "filters=" + urllib.parse.quote('{"label":["a=b"]}'),
                                   "filters=" + urllib.parse.quote('{"label":{"a=b":true},"status":["exited"]}')])
def test_listings_are_filtered_to_the_run(query):
    uri = rules().filter_query("/v1.41/containers/json" + ("?" + query if query else ""))
    params = dict(urllib.parse.parse_qsl(uri.split("?", 1)[1]))
    labels = json.loads(params["filters"])["label"]
    assert "org.kooi.run=run-1" in labels
    if "a%3Db" in query:
        assert "a=b" in labels


def test_a_filter_that_is_not_json_is_refused():
    with pytest.raises(BadRequest):
        rules().filter_query("/containers/json?filters=%7Bnope")


def test_an_unreachable_engine_surfaces_as_an_os_error():
    r = rules()
    with pytest.raises(OSError):
        r.owns("container", "abc")


def test_reader_hands_back_what_it_buffered():
    a, b = socket.socketpair()
    t = threading.Thread(target=lambda: (b.sendall(b"POST /exec/1/start HTTP/1.1\r\n\r\nstdin-bytes"), b.close()))
    t.start()
    r = Reader(a)
    read_head(r)
    t.join()
    rest = r.take()
    while chunk := a.recv(100):
        rest += chunk
    assert rest == b"stdin-bytes"


def test_a_refusal_reaches_a_client_that_is_still_sending_its_body(tmp_path):
    """A refused build's context is larger than any socket buffer: the broker must keep
    reading until the client is done, or the client sees EPIPE instead of the reason
    (found in CI: `docker build` through the broker failed with 'broken pipe')."""
    from kooi.broker import Broker
    from kooi.policy import Policy

    b = Broker(str(tmp_path / "b.sock"), str(tmp_path / "no-engine.sock"), Policy(workspace=str(tmp_path)),
               RunScope("r1", {"org.kooi.run": "r1"}))
    b.start()
    try:
        body = b"\0" * (32 << 20)
        s = socket.socket(socket.AF_UNIX)
        s.connect(b.listen)
        s.settimeout(30)
        errors: list[Exception] = []

        def send() -> None:
            try:
                s.sendall(b"POST /v1.41/build HTTP/1.1\r\nHost: docker\r\nContent-Type: application/x-tar\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except OSError as exc:
                errors.append(exc)

        t = threading.Thread(target=send)
        t.start()
        got = b""
        while chunk := s.recv(65536):
            got += chunk
            if b"}" in got:
                break
        t.join(30)
        s.close()
        assert got.startswith(b"HTTP/1.1 403 "), got[:200]
        assert "are refused" in json.loads(got.split(b"\r\n\r\n", 1)[1])["message"]
        assert errors == [] and not t.is_alive()
    finally:
        b.stop()
