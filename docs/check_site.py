"""Check the built site in a real browser: Debian's headless Chromium, driven through the Chrome
DevTools protocol (aiohttp's websocket client, from the `serve` extra).

    make docs && python docs/check_site.py --out site-check

It opens site/ both ways a reader does: from the file system (`file://.../site/index.html`, as
the README says) and served over HTTP on 127.0.0.1. Each way, in a fresh browser, it:
1. opens every page of the navigation: it must render its title, the navigation and the search
   box, every code block must have its copy button, and no page may log a console error or an
   uncaught exception, nor ask for anything outside the site;
2. types a query into the search box and waits for results;
3. clicks a code block's copy button and reads the clipboard back: it must hold the block's code;
4. clicks a link in the navigation and checks that it lands on that page (not on a folder);
5. saves screenshots of what it saw in --out.
Exits 1 with the list of problems, 0 when there are none. Needs `apt-get install -y chromium`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import http.server
import itertools
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-quic", "--window-size=1280,900"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nav_pages(config: Path) -> list[str]:
    """The site paths of every page in mkdocs.yml's navigation, in order, as the site built
    with its `use_directory_urls` names them: "serving/" and "" for index.md with directory
    URLs, "serving.html" and "index.html" without."""

    def walk(items: list[Any]) -> list[str]:
        pages = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            pages += walk(value) if isinstance(value, list) else [value]
        return pages

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # !!python/name tags
    settings = yaml.load(config.read_text(), Loader=Loader)
    paths = walk(settings["nav"])
    if not settings.get("use_directory_urls", True):
        return [path[:-3] + ".html" for path in paths]
    return [path[:-len("index.md")] if path.endswith("index.md") else path[:-3] + "/"
            for path in paths]


@contextlib.contextmanager
def serve_folder(folder: Path) -> Any:
    """An HTTP server for `folder` on 127.0.0.1, in a thread: yields its base URL."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


class Page:
    """One browser tab over the DevTools protocol: commands, and the events it collected."""

    def __init__(self, socket_: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket_
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            else:
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> dict:
        number = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[number] = future
        await self.socket.send_str(json.dumps({"id": number, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                                 returnByValue=True, userGesture=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 15) -> Any:
        """Poll `expression` until it is truthy; its value, or None at the deadline."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        return None

    async def goto(self, url: str) -> None:
        self.events.clear()
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete' && location.href.startsWith("
                            f"{json.dumps(url.split('#')[0])})")
        await asyncio.sleep(0.3)

    async def screenshot(self, path: Path) -> None:
        data = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(data["data"]))

    async def click(self, selector: str) -> None:
        """A real mouse click in the middle of the first element `selector` matches (waiting
        for it to appear)."""
        if not await self.wait_for(f"!!document.querySelector({json.dumps(selector)})"):
            raise RuntimeError(f"nothing matches {selector} on {await self.evaluate('location.href')}")
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                            button="left", clickCount=1)

    def problems(self, base: str) -> list[str]:
        """Console errors, uncaught exceptions and requests outside `base` since the last goto."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(f"console error: {[a.get('value') for a in params.get('args', [])]}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log error: {params['entry']['text']} {params['entry'].get('url', '')}")
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if not url.startswith((base, "data:", "blob:")):
                    found.append(f"request outside the site: {url}")
        return found


async def check(site: Path, out: Path, chromium: str) -> list[str]:
    """Every check, from the file system and over HTTP; the problems found, each prefixed
    with the way it was seen ("file://" or "http://")."""
    problems: list[str] = []
    with serve_folder(site) as served:
        for base in (site.resolve().as_uri() + "/", served):
            way = base.split(":", 1)[0] + "://"
            print(f"== the site opened over {way}")
            folder = out / way.rstrip(":/")
            folder.mkdir(parents=True, exist_ok=True)
            problems += [f"{way} {problem}" for problem in
                         await check_in_browser(base, folder, chromium)]
    return problems


async def check_in_browser(base: str, out: Path, chromium: str) -> list[str]:
    """Every check of the site at `base` (a folder URL ending in "/"), in a fresh browser."""
    problems: list[str] = []
    port = free_port()
    # Chromium's helpers may still write the profile as it ends: what is left stays in /tmp
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                    f"--remote-debugging-port={port}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            async with aiohttp.ClientSession() as session:
                targets: list[dict] = []
                for _ in range(100):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"http://127.0.0.1:{port}/json/list") as answer:
                            targets = [t for t in await answer.json() if t["type"] == "page"]
                    if targets:
                        break
                    await asyncio.sleep(0.2)
                async with session.ws_connect(targets[0]["webSocketDebuggerUrl"],
                                              max_msg_size=0) as socket_:
                    page = Page(socket_)
                    for domain in ("Page", "Runtime", "Log", "Network"):
                        await page.send(f"{domain}.enable")
                    origin = "file://" if base.startswith("file:") else base.rstrip("/")
                    await page.send("Browser.grantPermissions", origin=origin,
                                    permissions=["clipboardReadWrite", "clipboardSanitizedWrite"])
                    await page.send("Emulation.setFocusEmulationEnabled", enabled=True)
                    for name, step in (("pages", check_pages), ("search", check_search),
                                       ("copy", check_copy), ("navigation", check_navigation)):
                        try:
                            problems += await step(page, base, out)
                        except RuntimeError as error:  # an element it needs is not there
                            problems.append(f"{name}: {error}")
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    return problems


PAGES = nav_pages(REPO_ROOT / "mkdocs.yml")
"""Every page of the navigation, as the built site names it."""
HOME = "index.html"
"""Where search and navigation start: the file the README says to open."""
SCREENSHOT_PAGES = ("index", "getting-started", "serving", "evaluation", "reference/http-api",
                    "reference/cli", "reference/python/huggy_agent")


def page_path(name: str) -> str:
    """The site path of the page `name` ("serving", "index", "reference/cli") in PAGES."""
    return next(path for path in PAGES if path.removesuffix(".html").removesuffix("/")
                in (name, name.removesuffix("index").rstrip("/")))


async def check_pages(page: Page, base: str, out: Path) -> list[str]:
    problems = []
    shots = {page_path(name): name for name in SCREENSHOT_PAGES}
    for path in PAGES:
        await page.goto(base + path)
        state = await page.evaluate(
            "({title: document.querySelector('.md-content h1')?.textContent ?? null, "
            "nav: document.querySelectorAll('.md-nav__link').length, "
            "search: !!document.querySelector('.md-search__input'), "
            "blocks: document.querySelectorAll('.md-content pre > code').length, "
            "buttons: document.querySelectorAll('.md-content .md-code__button[data-md-type=copy]').length})")
        where = f"/{path}"
        if not state["title"] or state["nav"] < 10 or not state["search"]:
            problems.append(f"{where}: title, navigation or search missing: {state}")
        if state["buttons"] != state["blocks"]:
            problems.append(f"{where}: {state['blocks']} code blocks but {state['buttons']} copy buttons")
        problems += [f"{where}: {problem}" for problem in page.problems(base)]
        print(f"{where}: {state['title']!r}, {state['blocks']} code blocks, "
              f"{state['nav']} navigation links")
        if path in shots:
            name = shots[path].replace("/", "-").replace("index", "home")
            await page.screenshot(out / f"page-{name}.png")
    return problems


async def check_search(page: Page, base: str, out: Path) -> list[str]:
    await page.goto(base + HOME)
    await page.click(".md-search__input")
    await page.send("Input.insertText", text="tournament")
    found = await page.wait_for("document.querySelectorAll('.md-search-result__item').length")
    await page.screenshot(out / "search-tournament.png")
    titles = await page.evaluate("[...document.querySelectorAll('.md-search-result__item h1, "
                                 ".md-search-result__item h2')].slice(0, 5).map(e => e.textContent)")
    print(f"search 'tournament': {found} results, first {titles}")
    return [] if found else ["search: no results for 'tournament'"]


async def check_copy(page: Page, base: str, out: Path) -> list[str]:
    await page.goto(base + page_path("getting-started"))
    expected = await page.evaluate("document.querySelector('.md-content pre > code').innerText")
    await page.click(".md-content .md-code__button[data-md-type=copy]")
    await asyncio.sleep(0.5)
    copied = await page.evaluate("navigator.clipboard.readText()")
    print(f"copy button: {len(copied or '')} characters copied, "
          f"{'the same' if (copied or '').strip() == expected.strip() else 'NOT the same'} as the block")
    if (copied or "").strip() != expected.strip():
        return [f"copy: the clipboard holds {copied!r}, expected {expected!r}"]
    return []


async def check_navigation(page: Page, base: str, out: Path) -> list[str]:
    """From the home page, a click on "Serving" in the navigation must open the Serving page
    (its heading), not a folder listing."""
    serving = page_path("serving")
    await page.goto(base + HOME)
    await page.click(f".md-nav--primary a.md-nav__link[href$={json.dumps(serving)}]")
    landed = await page.wait_for(f"location.href === {json.dumps(base + serving)} && "
                                 "document.querySelector('.md-content h1')?.textContent")
    await page.screenshot(out / "navigated-serving.png")
    print(f"navigation: clicked Serving, landed on {landed!r}")
    return [] if landed else ["navigation: clicking Serving did not open the Serving page"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=REPO_ROOT / "site")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "site-check")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    if not (args.site / "index.html").exists():
        parser.error(f"{args.site} holds no built site: run `make docs` first")
    args.out.mkdir(parents=True, exist_ok=True)
    problems = asyncio.run(check(args.site, args.out, args.chromium))
    for problem in problems:
        print("problem:", problem)
    print(f"{len(problems)} problems; screenshots in {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
