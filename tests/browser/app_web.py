"""The application's packaged web in headless Chromium: log in by `arcane open --app`'s
one-time link, land on /ui/app/, and let the app list the models and stream a chat
through the Core; then, in a fresh browser, the app's files are refused.

Reads `link <url>` on stdin; prints `result <json>` then `done`. Every wait is on a
page state, never a fixed delay.
"""

import json
import os
import sys

from playwright.sync_api import sync_playwright

WAIT = 180_000  # ms: a bound on each wait, not a delay
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main():
    words = sys.stdin.readline().split()
    if len(words) != 2 or words[0] != "link":
        sys.exit(f"expected `link URL`, got {words!r}")
    link = words[1]
    core = link.split("/ui#")[0]
    result = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=os.environ["ARCANE_CHROMIUM"], headless=True, args=FLAGS)
        page = browser.new_page()
        page.goto(link)
        page.wait_for_url(core + "/ui/app/", timeout=WAIT)
        # Selectors, not script: the app's policy allows no `eval`, and the page keeps it.
        page.wait_for_selector('#answer[data-done="true"], body[data-error]', timeout=WAIT)
        result["url"] = page.url
        result["error"] = page.get_attribute("body", "data-error")
        result["models"] = page.inner_text("#models")
        result["answer"] = page.inner_text("#answer")
        result["reads"] = int(page.get_attribute("#answer", "data-reads") or "0")
        # The same browser's cookies: what the app's own files are served with. (The
        # browser itself goes there: only it resolves the dashboard's `*.localhost`
        # name, Playwright's own HTTP client does not.)
        asset = page.goto(core + "/ui/app/app.js")
        result["csp"] = asset.headers.get("content-security-policy")
        browser.close()
        # Without the session: nothing of the app, and /app/ only points to it.
        fresh = playwright.chromium.launch(
            executable_path=os.environ["ARCANE_CHROMIUM"], headless=True, args=FLAGS)
        context = fresh.new_context()
        response = context.new_page().goto(core + "/ui/app/app.js")
        result["withoutSession"] = {"status": response.status, "text": response.text()}
        port = core.rsplit(":", 1)[1]
        moved = context.request.get(f"http://127.0.0.1:{port}/app/", max_redirects=0)
        result["moved"] = {"status": moved.status, "location": moved.headers.get("location")}
        fresh.close()
    print("result " + json.dumps(result), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
