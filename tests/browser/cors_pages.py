"""Pages of two origins ask the Core for a streamed chat, in headless Chromium.

Protocol with the test that runs it (one line each way, so the Core can be started
with the allowed origin before any page loads):

1. This script serves the same page on two loopback ports and prints
   `pages <allowed_port> <other_port>`.
2. It reads `core <root_url> <token> <model>` on stdin.
3. It opens each page in Chromium (driven by Playwright, the system browser), waits
   for the page to finish (an event, not a delay) and prints `result <origin> <json>`
   for each, then `done`.

The page's JavaScript does what a web app would: `fetch` with the bearer token, read
the SSE stream chunk by chunk, and also try once without the token.
"""

import http.server
import json
import os
import sys
import threading

from playwright.sync_api import sync_playwright

PAGE = """<!doctype html>
<meta charset="utf-8"><title>arcane cors</title>
<script>
async function attempt(core, headers, body) {
  const out = {status: null, reads: 0, text: "", error: null};
  try {
    const response = await fetch(core + "/v1/chat/completions", {method: "POST", headers, body});
    out.status = response.status;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      out.reads += 1;
      out.text += decoder.decode(value, {stream: true});
    }
  } catch (error) {
    out.error = String(error);
  }
  return out;
}
async function run() {
  const p = new URLSearchParams(location.search);
  const core = p.get("core");
  const body = JSON.stringify({model: p.get("model"), stream: true, max_tokens: 24,
    messages: [{role: "user", content: "Count from one to ten."}]});
  const json = {"Content-Type": "application/json"};
  const withToken = await attempt(core, {...json, Authorization: "Bearer " + p.get("token")}, body);
  const withoutToken = await attempt(core, json, body);
  window.arcaneResult = {origin: location.origin, withToken, withoutToken};
}
run();
</script>
"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the standard library's name)
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve_page():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    allowed, other = serve_page(), serve_page()
    print(f"pages {allowed.server_address[1]} {other.server_address[1]}", flush=True)
    words = sys.stdin.readline().split()
    if len(words) != 4 or words[0] != "core":
        sys.exit(f"expected `core ROOT TOKEN MODEL`, got {words!r}")
    _, root, token, model = words
    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ["ARCANE_CHROMIUM"], headless=True, args=flags)
        for server in (allowed, other):
            page = browser.new_page()
            query = f"core={root}&token={token}&model={model}"
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/?{query}")
            page.wait_for_function("window.arcaneResult !== undefined", timeout=300_000)
            result = page.evaluate("window.arcaneResult")
            print(f"result {result['origin']} {json.dumps(result)}", flush=True)
            page.close()
        browser.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
