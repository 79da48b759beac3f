"""A small OpenAI-compatible stub on 127.0.0.1 for the faults a real server cannot be made to
produce on demand: 401/403, 429, 5xx and a stream that breaks mid-reply. It also records each
request (headers and JSON body) so a test can see what the remote engine sent.

    with Stub(owned_by="vllm") as stub:
        stub.status = 429; stub.headers = {"Retry-After": "7"}
        engine = RemoteEngine.connect(stub.url)
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = ["Hello", " from", " the", " stub", "."]


class Stub:
    def __init__(self, owned_by: str = "vllm", model: str = "stub-model", api_key: str | None = None,
                 pieces: list[str] | None = None, timings: bool = False, port: int = 0) -> None:
        self.owned_by, self.model, self.api_key = owned_by, model, api_key
        self.pieces = list(pieces or REPLY)
        self.timings = timings  # llama-server's `timings` in the last chunk (fixed figures)
        self.status = 200  # for /chat/completions and /completions
        self.headers: dict[str, str] = {}
        self.error_body: dict | str = {"error": {"message": "the stub says no"}}
        self.break_after: int | None = None  # pieces sent before the connection is dropped
        self.delay_s = 0.0  # wait before answering a completion request (a long prefill)
        self.requests: list[dict] = []  # {"path", "headers", "body"}
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                stub.record(self, None)
                if not stub.authorised(self):
                    return self.send_json(401, {"error": {"message": "invalid api key"}})
                if self.path.endswith("/models"):
                    return self.send_json(200, {"object": "list", "data": [
                        {"id": stub.model, "object": "model", "owned_by": stub.owned_by, "max_model_len": 4096}]})
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                stub.record(self, body)
                if not stub.authorised(self):
                    return self.send_json(401, {"error": {"message": "invalid api key"}})
                if not self.path.endswith("completions"):
                    return self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                time.sleep(stub.delay_s)
                if stub.status != 200:
                    return self.send_json(stub.status, stub.error_body, stub.headers)
                self.stream_reply("messages" in body)

            def send_json(self, code: int, body, headers: dict | None = None) -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def chunk(self, data: str) -> None:
                raw = data.encode()
                self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                self.wfile.flush()

            def stream_reply(self, chat: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, piece in enumerate(stub.pieces):
                    if stub.break_after is not None and i == stub.break_after:
                        self.close_connection = True
                        self.connection.shutdown(2)  # mid-body: the chunked encoding never ends
                        return
                    choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                    self.chunk(f"data: {json.dumps({'choices': [choice]})}\n\n")
                last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 12, "completion_tokens": len(stub.pieces)}}
                if stub.timings:
                    last["timings"] = {"prompt_n": 12, "cache_n": 0, "prompt_per_second": 480.0,
                                       "predicted_n": len(stub.pieces), "predicted_per_second": 125.0}
                self.chunk(f"data: {json.dumps(last)}\n\n")
                self.chunk("data: [DONE]\n\n")
                self.chunk("")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="remote-stub",
                                       daemon=True)  # polled every 50 ms: shutdown() waits no longer

    def record(self, handler: BaseHTTPRequestHandler, body: dict | None) -> None:
        self.requests.append({"path": handler.path, "headers": dict(handler.headers), "body": body})

    def authorised(self, handler: BaseHTTPRequestHandler) -> bool:
        return self.api_key is None or handler.headers.get("Authorization") == f"Bearer {self.api_key}"

    def last_body(self) -> dict:
        return [r for r in self.requests if r["body"] is not None][-1]["body"]

    def __enter__(self) -> "Stub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
