"""A capturing proxy: put it between a real client and the server, and it keeps every request the client sends.

    python tests/tools/capture_proxy.py --upstream http://127.0.0.1:3000 --port 3100 --out /tmp/captured \
        --program "codex exec" --version 0.171.0

Point the client at http://127.0.0.1:3100. Each request is forwarded unchanged (streams pass through as they come)
and written to --out as NNN-METHOD-path.json once its answer starts, in the corpus' shape (tests/fixtures/clients/README.md): where it came
from, method, path, query, the headers a server reads, the JSON body, and the status the server answered. Copy the
calls worth keeping into tests/fixtures/clients/<client>/<call>.json. Standard library and httpx only.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

logger = logging.getLogger("capture_proxy")

# Headers that change what a server does; the rest (auth, tracing, connection) are not kept.
KEPT_HEADERS = ("content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta",
                "x-stainless-lang", "x-stainless-package-version")
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
               "proxy-authenticate", "host", "content-length"}


class Recorder:
    def __init__(self, out: Path, source: dict[str, str]) -> None:
        self.out = out
        self.source = source
        self.counter = itertools.count(1)
        self.lock = threading.Lock()
        out.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with self.lock:
            number = next(self.counter)
        slug = re.sub(r"[^A-Za-z0-9]+", "_", record["path"]).strip("_") or "root"
        path = self.out / f"{number:03d}-{record['method']}-{slug}.json"
        path.write_text(json.dumps({"source": self.source, **record}, indent=2, ensure_ascii=False) + "\n")
        logger.info("%s %s -> %s (%s)", record["method"], record["path"], record["status"], path.name)


def handler_class(upstream: str, recorder: Recorder, client: httpx.Client) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            url = urlsplit(self.path)
            request = client.build_request(self.command, upstream + self.path, headers=headers, content=raw)
            response = client.send(request, stream=True)
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", errors="replace")
            # Written as soon as the answer starts: a client that gives up mid-answer still leaves its request.
            recorder.write({
                "method": self.command,
                "path": url.path,
                "query": url.query,
                "headers": {k.lower(): v for k, v in self.headers.items() if k.lower() in KEPT_HEADERS},
                "body": body,
                "status": response.status_code,
            })
            try:
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() not in HOP_HEADERS:
                        self.send_header(key, value)
                if self.command == "HEAD" or response.status_code in (204, 304):
                    self.send_header("Content-Length", response.headers.get("content-length", "0"))
                    self.end_headers()
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in response.iter_raw():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                logger.info("the client left before the answer's end: %s %s", self.command, url.path)
            finally:
                response.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = forward

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class' name
            logger.debug(format, *args)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the server, e.g. http://127.0.0.1:3000")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="directory the captured requests go to")
    parser.add_argument("--program", required=True, help="the client program, e.g. 'codex exec'")
    parser.add_argument("--version", required=True, help="the client's version")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    source = {"program": args.program, "version": args.version,
              "captured": datetime.date.today().isoformat(), "how": "tests/tools/capture_proxy.py"}
    client = httpx.Client(timeout=None, trust_env=False)
    server = ThreadingHTTPServer(("127.0.0.1", args.port),
                                 handler_class(args.upstream.rstrip("/"), Recorder(args.out, source), client))
    logger.info("capturing on http://127.0.0.1:%d -> %s", args.port, args.upstream)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
