"""The documentation site works offline: every page of the built site, opened in headless Chromium with
the network blocked, makes no request off the machine, and no page shows literal docstring markup (RST's double
backticks, a Sphinx role).

The site is what ``bash scripts/docs/build.sh`` builds into ``site/`` (CI's docs stage runs it before this tier).
Every request Chromium would send off the machine goes to a local HTTP proxy that records it and refuses it
(``--proxy-server``); host names do not resolve either (``--host-resolver-rules``), so nothing leaves even past the
proxy. A control page with a Google Fonts link and a remote image must be recorded, so a zero means something.
Chromium itself calls a few Google services whatever the page (the component updater, network time, the account
check: the same requests on an empty page, which no flag here turns off); those hosts, and only those, are not
counted as the site's.
Needs Debian's ``chromium`` (``apt-get install -y chromium``): skipped without it or without a built site on a
developer machine, a failure when ``CI`` is set.
"""

from __future__ import annotations

import re
import socketserver
import subprocess
import threading
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from helpers import CHROMIUM_FLAGS, require_chromium

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
# what Chromium asks of its own services on any page, an empty one too (not the site's requests)
BROWSER_OWN = frozenset({"update.googleapis.com", "accounts.google.com", "clients2.google.com"})
# RST literals and Sphinx roles, which Markdown prints as they are
LITERAL_MARKUP = re.compile(r"``|:(?:py:)?(?:func|class|meth|data|attr|mod|exc|obj|const):`")


class _Recorder(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), _Refuse)


class _Refuse(socketserver.StreamRequestHandler):
    """Records the request line (``CONNECT fonts.gstatic.com:443 HTTP/1.1``, ``GET http://...``) and refuses it."""

    def handle(self) -> None:
        line = self.rfile.readline(8192).decode("latin-1").strip()
        if line:
            self.server.requests.append(line)  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


@pytest.fixture(scope="module")
def proxy():
    srv = _Recorder()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _dom(exe: str, page: Path, proxy: _Recorder, profile: Path) -> str:
    """The page's DOM after its scripts ran, every request off the machine sent to ``proxy``."""
    cmd = [
        exe,
        *CHROMIUM_FLAGS,
        "--disable-features=NetworkTimeServiceQuerying",
        f"--user-data-dir={profile}",
        f"--proxy-server=http://127.0.0.1:{proxy.server_address[1]}",
        "--proxy-bypass-list=<-loopback>",  # even loopback goes to the recorder: every request is seen
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "<html" in proc.stdout, (page, proc.stderr[-2000:])
    return proc.stdout


def _host(request_line: str) -> str:
    """``CONNECT host:443 HTTP/1.1`` or ``GET http://host/path HTTP/1.1`` -> ``host``."""
    target = request_line.split(" ")[1] if " " in request_line else request_line
    return re.sub(r"^[a-z]+://", "", target).split("/")[0].rsplit(":", 1)[0]


def test_the_recorder_sees_a_request_off_the_machine(proxy, tmp_path):
    exe = require_chromium()
    page = tmp_path / "control.html"
    page.write_text(
        '<!DOCTYPE html><html><head><link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '</head><body><img src="http://example.com/x.png"><p>control</p></body></html>',
        encoding="utf-8",
    )
    before = len(proxy.requests)
    _dom(exe, page, proxy, tmp_path / "profile")
    seen = {_host(r) for r in proxy.requests[before:]}
    assert {"fonts.googleapis.com", "example.com"} <= seen, seen
    # an empty page: what the browser asks by itself is the BROWSER_OWN hosts, nothing else
    page.write_text("<!DOCTYPE html><html><body><p>empty</p></body></html>", encoding="utf-8")
    before = len(proxy.requests)
    _dom(exe, page, proxy, tmp_path / "profile-empty")
    assert {_host(r) for r in proxy.requests[before:]} <= BROWSER_OWN, proxy.requests[before:]


def test_every_page_of_the_site_makes_no_request_and_shows_no_literal_markup(proxy, tmp_path):
    from conftest import unavailable

    exe = require_chromium()
    if not (SITE / "index.html").is_file():
        unavailable("the built documentation site, site/ (bash scripts/docs/build.sh)")
    pages = sorted(SITE.rglob("*.html"))
    assert len(pages) >= 20 and SITE / "reference" / "report.html" in pages, pages
    literal: list[str] = []
    requests: dict[str, list[str]] = {}
    for i, page in enumerate(pages):
        before = len(proxy.requests)
        soup = BeautifulSoup(_dom(exe, page, proxy, tmp_path / f"profile{i}"), "html.parser")
        own = [r for r in proxy.requests[before:] if _host(r) not in BROWSER_OWN]
        if own:
            requests[str(page.relative_to(SITE))] = own
        for tag in soup(["script", "style", "pre"]):  # code blocks show code as written
            tag.decompose()
        if "demos" in page.relative_to(SITE).parts:
            continue  # a notebook's outputs are what the code printed (docstrings via help() keep their markup)
        for m in LITERAL_MARKUP.finditer(text := soup.get_text(" ")):
            literal.append(f"{page.relative_to(SITE)}: ...{text[max(0, m.start() - 60) : m.end() + 60]}...")
    assert requests == {}, requests
    assert literal == [], "\n".join(literal)
