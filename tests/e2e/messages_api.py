"""A scripted stand-in for Anthropic's Messages API, for end-to-end tests that run the
real Claude Code CLI against it (inside a network namespace the tests create; never a
real outside address). Prints "ready" on stdout once listening.

Usage: python3 messages_api.py --port P [--bind ADDR] [--cert CERT --key KEY]
                               --script SCRIPT.json --log LOG.jsonl

SCRIPT.json is {"model_turns": [TURN, ...], "by_marker": {MARKER: [TURN, ...]}}, one TURN
per model turn of the CLI's main loop (by_marker, optional: a conversation whose first
user message contains MARKER gets that script instead, so one server serves several
tests): {"tool": NAME, "input": {...}} streams one tool_use block (stop_reason tool_use),
{"text": "..."} one text block (stop_reason end_turn). "{tool_results}" in a text turn
is replaced by a JSON list of the tool_result contents the request carries (strings,
at most 4000 characters each), so the CLI's final `result` brings them back.

A main-loop request (POST /v1/messages with a non-empty "tools" list and no
x-claude-code-request-class header, or "main") gets turn N, N being the number of
tool_result blocks in its user messages; past the script's end a short end_turn text.
Any other Messages request (no tools, or another request class) gets the text "ok".
Streamed (server-sent events, close-delimited body) if the body says "stream": true,
else one JSON message.

Other endpoints: POST /v1/messages/count_tokens, GET /v1/models, HEAD/GET / and
/api/hello; anything else 404 with Anthropic's error envelope.

Every request is appended to LOG.jsonl (flushed) as one JSON object: time, peer,
method, path (with query), headers (all of them, names lowercased, values as sent),
body (parsed JSON or null), turn (or null), request_class, status.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import socket
import socketserver
import ssl
import sys
import threading
import time
import uuid
import zlib
from typing import Any

RESULT_LIMIT = 4000
PLACEHOLDER = "{tool_results}"
MODELS = {
    "data": [{"type": "model", "id": "claude-sonnet-4-5", "display_name": "x",
              "created_at": "2025-01-01T00:00:00Z"}],
    "has_more": False, "first_id": "claude-sonnet-4-5", "last_id": "claude-sonnet-4-5",
}


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def tool_results(body: Any) -> list[str]:
    """The contents of the tool_result blocks in the request's user messages, in order,
    as strings (a list of content blocks becomes its text blocks joined)."""
    out: list[str] = []
    messages = body.get("messages") if isinstance(body, dict) else None
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, dict) or msg.get("role") != "user" or not isinstance(msg.get("content"), list):
            continue
        for block in msg["content"]:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            content = block.get("content", "")
            if isinstance(content, list):
                content = "\n".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
            elif not isinstance(content, str):
                content = json.dumps(content)
            out.append(content[:RESULT_LIMIT])
    return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: Server

    # -- plumbing -----------------------------------------------------------------

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        enc = self.headers.get("Content-Encoding", "").lower()
        if enc == "gzip":
            data = gzip.decompress(data)
        elif enc == "deflate":
            data = zlib.decompress(data)
        return data

    def log_request_line(self, body: Any, status: int, turn: int | None = None) -> None:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        entry = {
            "time": time.time(), "peer": f"{self.client_address[0]}:{self.client_address[1]}",
            "method": self.command, "path": self.path, "headers": headers, "body": body,
            "turn": turn, "request_class": self.headers.get("x-claude-code-request-class"), "status": status,
        }
        self.server.log(entry)

    def base_headers(self, status: int, content_type: str | None) -> None:
        self.send_response(status)
        self.send_header("request-id", new_id("req_"))
        if content_type:
            self.send_header("Content-Type", content_type)

    def send_json(self, status: int, obj: Any, extra: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.base_headers(status, "application/json")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_empty(self) -> None:
        self.base_headers(200, None)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_sse(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        # Close-delimited: no Content-Length, no chunking, the body ends with the connection.
        self.base_headers(200, "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self.wfile.flush()
        for name, data in events:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

    # -- requests -----------------------------------------------------------------

    def handle_any(self) -> None:
        raw = self.read_body() if self.command not in ("GET", "HEAD") or self.headers.get("Content-Length") else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if len(path) > 1:
            path = path.rstrip("/")

        if self.command == "POST" and path == "/v1/messages":
            self.messages(body if isinstance(body, dict) else {})
            return
        if self.command == "POST" and path == "/v1/messages/count_tokens":
            self.log_request_line(body, 200)
            self.send_json(200, {"input_tokens": 42})
            return
        if self.command == "GET" and path == "/v1/models":
            self.log_request_line(body, 200)
            self.send_json(200, MODELS)
            return
        if self.command in ("GET", "HEAD") and path in ("/", "/api/hello"):
            self.log_request_line(body, 200)
            self.send_empty()
            return
        self.log_request_line(body, 404)
        self.send_json(404, {"type": "error", "error": {
            "type": "not_found_error", "message": f"messages_api stand-in: no route for {self.command} {path}"}},
            {"x-should-retry": "false"})

    def messages(self, body: dict[str, Any]) -> None:
        request_class = self.headers.get("x-claude-code-request-class")
        tools = body.get("tools")
        main = bool(isinstance(tools, list) and tools) and request_class in (None, "main")
        turn: int | None = None
        if main:
            results = tool_results(body)
            turn = len(results)
            script = self.server.turns_for(body)
            step: dict[str, Any] = script[turn] if turn < len(script) else {"text": "(messages_api: script exhausted)"}
            if "tool" not in step:
                text = str(step.get("text", ""))
                if PLACEHOLDER in text:
                    text = text.replace(PLACEHOLDER, json.dumps(results))
                step = {"text": text}
        else:
            step = {"text": "ok"}
        self.log_request_line(body, 200, turn)

        model = str(body.get("model") or "claude-sonnet-4-5")
        usage = {"input_tokens": 42, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if "tool" in step:
            block = {"type": "tool_use", "id": new_id("toolu_"), "name": step["tool"], "input": step.get("input", {})}
            stop_reason = "tool_use"
        else:
            block = {"type": "text", "text": step["text"]}
            stop_reason = "end_turn"
        message: dict[str, Any] = {
            "id": new_id("msg_"), "type": "message", "role": "assistant", "model": model, "content": [block],
            "stop_reason": stop_reason, "stop_sequence": None, "usage": usage,
        }
        if not body.get("stream"):
            self.send_json(200, message)
            return

        if block["type"] == "tool_use":
            start_block = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start_block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        self.send_sse([
            ("message_start", {"type": "message_start", "message": {
                **message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start_block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                               "usage": {"output_tokens": usage["output_tokens"]}}),
            ("message_stop", {"type": "message_stop"}),
        ])

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = handle_any

    def log_message(self, *args: Any) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], turns: list[dict[str, Any]], log_path: str,
                 tls: ssl.SSLContext | None, by_marker: dict[str, list[dict[str, Any]]] | None = None) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.turns = turns
        self.by_marker = by_marker or {}
        self.tls = tls
        self.log_lock = threading.Lock()
        self.log_file = open(log_path, "a", encoding="utf-8")
        super().__init__(addr, Handler)

    def turns_for(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages")
        first = json.dumps(messages[0]) if isinstance(messages, list) and messages else ""
        return next((t for m, t in self.by_marker.items() if m in first), self.turns)

    def log(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, default=str)
        with self.log_lock:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # TLS handshake in the connection's own thread, not in accept(): a stalled client
        # must not hold up the others.
        if self.tls is not None:
            request = self.tls.wrap_socket(request, server_side=True)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, TimeoutError)):
            return  # a client that went away or failed the handshake
        super().handle_error(request, client_address)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bind", default="0.0.0.0")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--script", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    if bool(args.cert) != bool(args.key):
        ap.error("--cert and --key go together")
    with open(args.script, encoding="utf-8") as fh:
        script = json.load(fh)
    tls = None
    if args.cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.cert, args.key)
    server = Server((args.bind, args.port), script["model_turns"], args.log, tls, script.get("by_marker"))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
