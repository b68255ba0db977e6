"""The dashboard in headless Chromium: log in by the one-time link, use every panel,
then try the link again and read the dashboard from a page of another origin.

Protocol with the test that runs it:

1. This script serves a page on a loopback port of its own (the "other origin"),
   recording the `Cookie` header of every request it receives, and prints
   `page <port>`.
2. It reads `link <url> <model> <screenshot-dir>` on stdin (`-` for no screenshot).
3. It drives the pages, waiting on page states (selectors and conditions, never fixed
   delays), and prints `result <json>` for each step, then `done`. A step that fails
   prints `result {"step": …, "error": …}` and the script goes on where it can.
"""

import http.server
import json
import os
import sys
import threading
import traceback

from playwright.sync_api import sync_playwright

WAIT = 180_000  # ms: a bound on each wait, not a delay

FOREIGN = """<!doctype html>
<meta charset="utf-8"><title>another origin</title>
<script>
async function attempt(url, init) {
  const out = {status: null, text: "", error: null};
  try {
    const response = await fetch(url, init);
    out.status = response.status;
    out.text = await response.text();
  } catch (error) {
    out.error = String(error);
  }
  return out;
}
function events(url) {
  return new Promise((resolve) => {
    const out = {messages: 0, error: null};
    const source = new EventSource(url, {withCredentials: true});
    source.onmessage = () => { out.messages += 1; };
    source.onerror = () => { out.error = "error"; source.close(); resolve(out); };
  });
}
async function run() {
  const core = new URLSearchParams(location.search).get("core");
  const frame = JSON.stringify({protocol: "arcane/1", type: "request", id: "x", method: "models.list"});
  window.arcaneResult = {
    origin: location.origin,
    rpc: await attempt(core + "/ui/api/rpc", {method: "POST", credentials: "include",
      headers: {"Content-Type": "text/plain"}, body: frame}),
    rpcNoCors: await attempt(core + "/ui/api/rpc", {method: "POST", credentials: "include",
      mode: "no-cors", body: frame}),
    metrics: await attempt(core + "/ui/api/metrics", {credentials: "include"}),
    page: await attempt(core + "/ui", {credentials: "include"}),
    events: await events(core + "/ui/api/events"),
  };
}
run();
</script>
"""


RECEIVED = []  # the `Cookie` header of each request the other port received


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the standard library's name)
        RECEIVED.append(f"{self.path} cookie={self.headers.get('Cookie') or ''}")
        body = FOREIGN.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def report(step, **fields):
    print("result " + json.dumps({"step": step, **fields}), flush=True)


def step(name, action):
    try:
        report(name, **action())
    except Exception as error:  # noqa: BLE001 (every failure is reported to the test)
        report(name, error=f"{error}\n{traceback.format_exc()}")


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"page {server.server_address[1]}", flush=True)
    words = sys.stdin.readline().split()
    if len(words) != 4 or words[0] != "link":
        sys.exit(f"expected `link URL MODEL SCREENSHOTS`, got {words!r}")
    _, url, model, shots = words
    root = url.split("/ui", 1)[0]
    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]

    def shot(page, name):
        if shots != "-":
            page.screenshot(path=os.path.join(shots, f"{name}.png"), full_page=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ["ARCANE_CHROMIUM"], headless=True, args=flags)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        row = f'tr[data-model="{model}"]'

        def login():
            page.goto(url)
            page.wait_for_selector('body[data-page="dashboard"]', timeout=WAIT)
            page.wait_for_selector(f'{row}[data-state="ready"]', timeout=WAIT)
            cookies = context.cookies()
            return {"href": page.evaluate("location.href"),
                    "historyLength": page.evaluate("history.length"),
                    "cookies": [{k: c[k] for k in ("name", "path", "httpOnly", "sameSite")}
                                for c in cookies],
                    "row": page.inner_text(row)}

        def unload_and_load():
            page.click(f'{row} button[data-action="unload"]')
            page.wait_for_selector(f'{row}[data-state="stopped"]', timeout=WAIT)
            after_unload = page.inner_text(row)
            page.click(f'{row} button[data-action="load"]')
            page.wait_for_selector(f'{row}[data-state="ready"]', timeout=WAIT)
            return {"unloaded": after_unload, "ready": page.inner_text(row)}

        def playground():
            page.select_option("#chat-model", model)
            page.fill("#chat-prompt", "Count from one to five.")
            page.fill("#chat-max", "24")
            page.click("#chat-send")
            page.wait_for_selector('#chat-status[data-state="done"], #chat-status[data-state="error"]',
                                   timeout=WAIT)
            return {"status": page.get_attribute("#chat-status", "data-state"),
                    "statusText": page.inner_text("#chat-status"),
                    "text": page.inner_text("#chat-output")}

        def events_and_logs():
            page.wait_for_function(
                "document.querySelectorAll('#events li[data-event^=\"local-ai.model.\"]').length >= 2",
                timeout=WAIT)
            page.wait_for_function(
                "['following','unavailable','ended'].includes(document.querySelector('#logs-status').dataset.state)",
                timeout=WAIT)
            if page.get_attribute("#logs-status", "data-state") == "following":
                page.wait_for_function("document.querySelectorAll('#logs li').length > 0",
                                       timeout=WAIT)
            page.wait_for_function(
                f"(() => {{ const r = document.querySelector('#usage tr[data-model=\"{model}\"]');"
                " return r && Number(r.children[1].textContent) >= 1; })()",
                timeout=WAIT)
            shot(page, "dashboard")
            return {"events": [li.inner_text() for li in page.query_selector_all("#events li")][:40],
                    "logsState": page.get_attribute("#logs-status", "data-state"),
                    "logsText": page.inner_text("#logs-status"),
                    "logLines": len(page.query_selector_all("#logs li")),
                    "usage": page.inner_text(f'#usage tr[data-model="{model}"]'),
                    "devices": page.inner_text("#devices")}

        def foreign():
            other = context.new_page()
            other.goto(f"http://127.0.0.1:{server.server_address[1]}/?core={root}")
            other.wait_for_function("window.arcaneResult !== undefined", timeout=WAIT)
            result = other.evaluate("window.arcaneResult")
            other.close()
            return result

        def other_port():
            # The logged-in browser visits another port's `/ui` paths, by both of the
            # loopback names: a server there must receive no session cookie.
            RECEIVED.clear()
            port = server.server_address[1]
            visit = context.new_page()
            for target in (f"http://127.0.0.1:{port}/ui/api/rpc", f"http://localhost:{port}/ui",
                           f"http://127.0.0.1:{port}/ui/app/"):
                visit.goto(target)
                visit.wait_for_selector("body", state="attached", timeout=WAIT)
            visit.close()
            return {"cookies": list(RECEIVED)}

        def again():
            # A fresh browser profile (no cookie), the same link: refused.
            fresh = browser.new_context()
            second = fresh.new_page()
            second.goto(url)
            second.wait_for_selector('#login-status[data-state="refused"]', timeout=WAIT)
            shot(second, "link-used-twice")
            result = {"page": second.get_attribute("body", "data-page"),
                      "status": second.inner_text("#login-status"),
                      "body": second.inner_text("body"),
                      "cookies": len(fresh.cookies())}
            fresh.close()
            return result

        def logout():
            page.click("#logout")
            page.wait_for_selector('body[data-page="login"]', timeout=WAIT)
            page.goto(root + "/ui")
            page.wait_for_selector("body", timeout=WAIT)
            return {"page": page.get_attribute("body", "data-page")}

        step("login", login)
        step("unload-and-load", unload_and_load)
        step("playground", playground)
        step("events-and-logs", events_and_logs)
        step("foreign", foreign)
        step("other-port", other_port)
        step("again", again)
        step("logout", logout)
        browser.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
