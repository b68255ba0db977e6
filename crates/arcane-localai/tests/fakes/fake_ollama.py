#!/usr/bin/env python3
"""A stand-in for `ollama`, Python standard library only, faithful to the parts of its
documented HTTP API and CLI that the supervisor relies on.

* `ollama serve` reads `OLLAMA_HOST` (`host:port`, `http://host:port`, or a bare
  host; default `127.0.0.1:11434`) and `OLLAMA_MODELS`, and logs
  `Listening on 127.0.0.1:11434 (version 0.5.1)` on stderr as ollama does.
* `ollama --version` prints `ollama version is 0.5.1`.
* HTTP: `GET /` (`Ollama is running`), `GET /api/version` (`{"version": …}`),
  `GET /api/tags` (the `*.gguf` files in OLLAMA_MODELS as models), `GET /api/ps`,
  `POST /api/chat` (non-streamed).

Test knobs (never passed by Arcane itself): `--fake-version V` reports another
version; `--fake-record FILE` writes `{"argv", "OLLAMA_HOST", "OLLAMA_MODELS"}` there.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.5.1"


def parse_host(value):
    value = (value or "").strip() or "127.0.0.1:11434"
    if "://" in value:
        value = value.split("://", 1)[1]
    value = value.rstrip("/")
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.lstrip(":") or "11434"
    elif ":" in value:
        host, _, port = value.rpartition(":")
    else:
        host, port = value, "11434"
    return host or "127.0.0.1", int(port)


def serve(args):
    version = VERSION
    record = None
    index = 0
    while index < len(args):
        if args[index] == "--fake-version":
            version = args[index + 1]
            index += 1
        elif args[index] == "--fake-record":
            record = args[index + 1]
            index += 1
        index += 1
    host, port = parse_host(os.environ.get("OLLAMA_HOST"))
    models = os.environ.get("OLLAMA_MODELS") or os.path.expanduser("~/.ollama/models")
    if record:
        with open(record, "w") as f:
            json.dump({"argv": sys.argv[1:], "OLLAMA_HOST": os.environ.get("OLLAMA_HOST"),
                       "OLLAMA_MODELS": os.environ.get("OLLAMA_MODELS")}, f)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body, content_type="application/json; charset=utf-8"):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/":
                return self.reply(200, "Ollama is running", "text/plain; charset=utf-8")
            if self.path == "/api/version":
                return self.reply(200, {"version": version})
            if self.path == "/api/tags":
                found = []
                if os.path.isdir(models):
                    for name in sorted(os.listdir(models)):
                        if name.endswith(".gguf"):
                            found.append({"name": name[:-5] + ":latest", "model": name[:-5] + ":latest",
                                          "size": os.path.getsize(os.path.join(models, name))})
                return self.reply(200, {"models": found})
            if self.path == "/api/ps":
                return self.reply(200, {"models": []})
            return self.reply(404, "404 page not found", "text/plain; charset=utf-8")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path == "/api/chat":
                return self.reply(200, {"model": "fake", "done": True,
                                        "message": {"role": "assistant", "content": "hello from fake ollama"}})
            return self.reply(404, "404 page not found", "text/plain; charset=utf-8")

    class Server(ThreadingHTTPServer):
        address_family = __import__("socket").AF_INET6 if ":" in host else __import__("socket").AF_INET
        allow_reuse_address = True  # as cpp-httplib and Go do (SO_REUSEADDR)
        daemon_threads = True

    try:
        server = Server((host, port), Handler)
    except OSError as error:
        print(f"Error: listen tcp {host}:{port}: bind: address already in use ({error})", file=sys.stderr)
        sys.exit(1)
    print(f'time=2026-11-29T00:00:00.000Z level=INFO source=routes.go:1 msg="Listening on {host}:{port} (version {version})"',
          file=sys.stderr, flush=True)
    server.serve_forever()


def main():
    args = sys.argv[1:]
    if args[:1] in (["--version"], ["-v"]):
        print(f"ollama version is {VERSION}")
        return
    if args[:1] == ["serve"]:
        return serve(args[1:])
    print("Usage:\n  ollama [command]\n\nAvailable Commands:\n  serve       Start ollama", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
