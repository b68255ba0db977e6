#!/usr/bin/env python3
"""A fault-injecting stand-in for llama.cpp's `llama-server`, Python standard library only.

It speaks the parts of llama-server's protocol the supervisor relies on:

* command line: `--host H --port P`, or `--host PATH.sock` (a Unix socket, as
  llama-server takes it), `--api-key-file FILE` (keys one per line, `#` comments; then
  every path but `/health` and `/v1/health` answers 401 without `Authorization: Bearer
  <key>`, with llama-server's body); other llama-server flags are accepted and ignored;
  `--version` prints a llama-style version line;
* it binds like llama-server, and when the port is taken prints
  `couldn't bind HTTP server socket, hostname: H, port: P` and exits 1;
* it announces `main: server is listening on http://H:P - starting the main loop`
  on stderr, as current llama-server builds do;
* `GET /health`: `200 {"status":"ok"}` when ready; while loading, `503` with the new
  body `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`
  (or the old `{"status":"loading model"}` shape);
* `GET /props` (`build_info`), `GET /v1/models`, `POST /v1/chat/completions`.

Faults, chosen with `--fake-mode MODE` (repeatable):

* `loading=SECONDS` / `loading-old=SECONDS`: answer 503 (new / old shape) for a while;
* `loading-forever`: answer 503 forever, printing nothing (a stalled load);
* `http500`: `/health` answers HTTP 500;
* `exit-early=CODE`: print an error on stderr and exit with CODE before binding;
* `never-ready`: never bind, never print;
* `ignore-term`: ignore SIGTERM (only SIGKILL ends it);
* `crash-after=SECONDS`: exit with code 7 that long after becoming ready;
  with `--fake-state FILE`, only when FILE does not exist yet (it is then created);
* `silent`: do not print the listening line (readiness must come from polling).
* `busy-health=SECONDS`: a chat completion works the CPU for SECONDS, and `/health`
  waits behind it (as llama-server's health check waits behind its busy HTTP threads
  on an overloaded machine);
* `die-on-request`: a chat completion (or Anthropic message), once read, kills the
  server before a byte of its answer (exit code 9, as a crash mid-request); with
  `--fake-state FILE`, only when FILE does not exist yet (it is then created): the
  next server answers;
* `refuse-restart`: with `--fake-state FILE`, when FILE exists, fail to load as
  `exit-early` does (exit code 1): the server that would replace a crashed one never
  starts;
* `hang-after=SECONDS`: that long after becoming ready, `/health` stops answering
  (the request is read, never answered) while the process stays idle (a hang).
"""

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUILD = 4242


def parse(argv):
    options = {"host": "127.0.0.1", "port": 8080, "modes": [], "state": None, "alias": None, "keys": None}
    index = 0
    while index < len(argv):
        arg = argv[index]
        value = argv[index + 1] if index + 1 < len(argv) else None
        if arg == "--version":
            print(f"version: {BUILD} (fake)", file=sys.stderr)
            print("built with fake python for testing", file=sys.stderr)
            sys.exit(0)
        if arg == "--host":
            options["host"] = value
            index += 1
        elif arg == "--port":
            options["port"] = int(value)
            index += 1
        elif arg == "--api-key-file":
            with open(value) as f:
                options["keys"] = [l.strip() for l in f if l.strip() and not l.startswith("#")]
            index += 1
        elif arg == "--fake-mode":
            options["modes"].append(value)
            index += 1
        elif arg == "--fake-state":
            options["state"] = value
            index += 1
        elif arg in ("--alias", "-a"):
            options["alias"] = value
            index += 1
        index += 1
    modes = {}
    for mode in options["modes"]:
        name, _, argument = mode.partition("=")
        modes[name] = argument
    options["modes"] = modes
    return options


def main():
    options = parse(sys.argv[1:])
    modes = options["modes"]
    log = lambda text: (print(text, file=sys.stderr, flush=True))
    log("build: %d (fake) with python" % BUILD)
    log("system info: n_threads = 2 | fake")
    if "ignore-term" in modes:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "refuse-restart" in modes and options["state"] and os.path.exists(options["state"]):
        log("error: failed to load model (fake refused restart)")
        sys.exit(1)
    if "exit-early" in modes:
        log("error: failed to load model (fake early exit)")
        sys.exit(int(modes["exit-early"] or 1))
    if "never-ready" in modes:
        while True:
            time.sleep(3600)

    started = time.monotonic()
    loading_for = None
    old_shape = False
    if "loading" in modes:
        loading_for = float(modes["loading"] or 1)
    if "loading-old" in modes:
        loading_for = float(modes["loading-old"] or 1)
        old_shape = True
    if "loading-forever" in modes:
        loading_for = float("inf")
    ready_at = [None]

    def is_loading():
        return loading_for is not None and time.monotonic() - started < loading_for

    work = threading.Lock()

    def hung():
        return ("hang-after" in modes and ready_at[0] is not None
                and time.monotonic() - ready_at[0] >= float(modes["hang-after"] or 0))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def refused(self):
            keys = options["keys"]
            if keys is None or self.path in ("/health", "/v1/health"):
                return False
            given = self.headers.get("Authorization", "")
            if given.startswith("Bearer ") and given[len("Bearer "):] in keys:
                return False
            self.reply(401, {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
            return True

        def do_GET(self):
            if self.refused():
                return
            if self.path in ("/health", "/v1/health"):
                if hung():
                    threading.Event().wait()
                if "busy-health" in modes:
                    with work:
                        pass
                if "http500" in modes:
                    return self.reply(500, {"error": {"code": 500, "message": "internal fake failure"}})
                if is_loading():
                    if old_shape:
                        return self.reply(503, {"status": "loading model"})
                    return self.reply(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
                if ready_at[0] is None:
                    ready_at[0] = time.monotonic()
                return self.reply(200, {"status": "ok"})
            if self.path == "/props":
                return self.reply(200, {"build_info": "b%d-fake" % BUILD, "model_path": "fake.gguf"})
            if self.path in ("/v1/models", "/models"):
                name = options["alias"] or "fake"
                return self.reply(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            return self.reply(404, {"error": {"code": 404, "message": "File Not Found"}})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.refused():
                return
            chat = self.path in ("/v1/chat/completions", "/chat/completions")
            if "die-on-request" in modes and (chat or self.path == "/v1/messages"):
                state = options["state"]
                if state is None or not os.path.exists(state):
                    if state is not None:
                        open(state, "w").close()
                    log("fake crash on a request: segmentation fault")
                    os._exit(9)
            if chat:
                if "busy-health" in modes:
                    with work:
                        until = time.monotonic() + float(modes["busy-health"] or 1)
                        while time.monotonic() < until:
                            sum(range(1000))
                return self.reply(200, {
                    "object": "chat.completion",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hello from the fake"}}],
                })
            return self.reply(404, {"error": {"code": 404, "message": "File Not Found"}})

    unix = options["host"].endswith(".sock")
    if unix:
        family = socket.AF_UNIX
    else:
        family = socket.AF_INET6 if ":" in options["host"] else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        allow_reuse_address = not unix  # as cpp-httplib and Go do (SO_REUSEADDR)
        daemon_threads = True

        def server_bind(self):
            if unix:
                self.socket.bind(self.server_address)
                self.server_name, self.server_port = "localhost", 0
            else:
                super().server_bind()

        def get_request(self):
            request, address = self.socket.accept()
            # BaseHTTPRequestHandler wants a (host, port) client address.
            return request, (address if not unix else ("local", 0))

    try:
        server = Server(options["host"] if unix else (options["host"], options["port"]), Handler)
    except OSError:
        log("couldn't bind HTTP server socket, hostname: %s, port: %d" % (options["host"], options["port"]))
        sys.exit(1)
    if "silent" not in modes:
        if unix:
            log("llama_server: listening on unix://%s" % options["host"])
        else:
            log("main: server is listening on http://%s:%d - starting the main loop" % (options["host"], options["port"]))
    if "crash-after" in modes:
        state = options["state"]
        crash = state is None or not os.path.exists(state)
        if crash and state is not None:
            open(state, "w").close()
        if crash:
            delay = float(modes["crash-after"] or 0.5)

            def crasher():
                while ready_at[0] is None:
                    time.sleep(0.01)
                time.sleep(delay)
                log("fake crash: segmentation fault")
                os._exit(7)

            threading.Thread(target=crasher, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
