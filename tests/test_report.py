"""Report tests: numbers trace back to counts.parquet, and the page renders in Chromium.

The Chromium test drives the Debian `chromium` binary headless over the DevTools
protocol (a tiny stdlib WebSocket client below, no downloads): it opens
report.html from disk, checks that every <img> decoded (naturalWidth > 0), that
nothing was logged as an error on the console, and keeps a screenshot as
`report_screenshot.png` beside the report. It is skipped when /usr/bin/chromium
(or `chromium` on PATH) is absent.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from headprobe.report import build_report, head_roles, main_report
try:
    from tests.fixtures_results import make_results_dir
except ImportError:            # tests/ itself on sys.path (pytest's default rootdir handling)
    from fixtures_results import make_results_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return make_results_dir(tmp_path_factory.mktemp("results"), seed=0)


@pytest.fixture(scope="module")
def report(results_dir):
    return build_report(results_dir)


@pytest.fixture(scope="module")
def counts(results_dir):
    c = pd.read_parquet(results_dir / "counts.parquet")
    for col in ("direction", "variant", "fold", "label"):
        c[col] = c[col].fillna("").astype(str)
    return c


@pytest.fixture(scope="module")
def html_tables(report):
    parser = TableParser()
    parser.feed(report["html"].read_text(encoding="utf-8"))
    return parser.tables


class TableParser(HTMLParser):
    """Collects every <table data-table=NAME>: rows of (row attrs, {col: text}, [texts])."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list] = {}
        self._table = None
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("data-table", f"t{len(self.tables)}"), [])
        elif tag == "tr" and self._table is not None:
            self._row = ({k[5:]: v for k, v in a.items() if k.startswith("data-")}, {}, [])
        elif tag == "td" and self._row is not None:
            self._cell = [a.get("data-col"), ""]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            col, text = self._cell
            if col:
                self._row[1][col] = text
            self._row[2].append(text)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row[2]:
                self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None


def ratio(counts, **where):
    sel = counts
    for key, value in where.items():
        sel = sel[sel[key] == value]
    assert len(sel), where
    return sel["hits"].sum() / sel["n"].sum(), sel["n"].sum()


def rows_of(tables, name):
    assert name in tables, sorted(tables)
    return {r[0].get("label", r[2][0]): r for r in tables[name]}


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize("label", ["ALL", "nsubj", "det"])
def test_dependency_cells_equal_counts(html_tables, counts, label):
    attrs, cells, _ = rows_of(html_tables, "dependency-top-heads")[label]
    layer, head, direction = int(attrs["layer"]), int(attrs["head"]), attrs["direction"]
    assert cells["head"] == f"{layer}-{head}"
    acc, n = ratio(counts, analysis="dependency", label=label, layer=layer, head=head,
                   direction=direction, variant="", fold="")
    assert float(cells["accuracy"]) == pytest.approx(round(acc, 4), abs=1e-12)
    assert int(cells["n"]) == n
    # the shown head is the best (layer, head, direction) in counts
    heads = counts[(counts["analysis"] == "dependency") & (counts["label"] == label)
                   & (counts["variant"] == "") & (counts["fold"] == "")]
    assert acc == pytest.approx((heads["hits"] / heads["n"]).max())
    base, _ = ratio(counts, analysis="dependency", label=label, variant=cells["baseline"],
                    fold="")
    assert float(cells["baseline_accuracy"]) == pytest.approx(round(base, 4), abs=1e-12)
    bl = counts[(counts["analysis"] == "dependency") & (counts["label"] == label)
                & (counts["variant"] != "") & (counts["fold"] == "")]
    assert base == pytest.approx((bl["hits"] / bl["n"]).max())     # the best offset
    assert float(cells["gap"]) == pytest.approx(acc - base, abs=6e-5)


@pytest.mark.parametrize("kind", ["ALL", "pronoun"])
def test_coreference_cells_equal_counts(html_tables, counts, kind):
    attrs, cells, _ = rows_of(html_tables, "coreference-top-heads")[kind]
    acc, n = ratio(counts, analysis="coreference", label=kind, layer=int(attrs["layer"]),
                   head=int(attrs["head"]), variant="", fold="")
    assert float(cells["accuracy"]) == pytest.approx(round(acc, 4), abs=1e-12)
    assert int(cells["n"]) == n
    for variant in ("nearest", "head_match", "rules"):
        base, _ = ratio(counts, analysis="coreference", label=kind, variant=variant, fold="")
        assert float(cells[f"baseline:{variant}"]) == pytest.approx(round(base, 4), abs=1e-12)


def test_surface_and_positional_cells_equal_counts(html_tables, counts):
    for attrs, cells, _ in html_tables["surface-per-layer"]:
        layer = int(attrs["layer"])
        for label in ("cls", "sep", "punct", "entropy"):
            sel = counts[(counts["analysis"] == "surface") & (counts["label"] == label)
                         & (counts["layer"] == layer) & (counts["fold"] == "")]
            assert float(cells[label]) == pytest.approx(
                round(sel["mass"].sum() / sel["n"].sum(), 4), abs=1e-12)
    attrs, cells, _ = html_tables["positional-top"][0]
    share, n = ratio(counts, analysis="positional", label="+1", layer=int(attrs["layer"]),
                     head=int(attrs["head"]), fold="")
    assert float(cells["dominant_share"]) == pytest.approx(round(share, 4), abs=1e-12)
    assert float(cells["share:+1"]) == pytest.approx(round(share, 4), abs=1e-12)


def test_markdown_carries_the_same_numbers(report, html_tables):
    md = report["markdown"].read_text(encoding="utf-8")
    for name in ("dependency-top-heads", "coreference-top-heads"):
        for _, _, texts in html_tables[name]:
            line = "| " + " | ".join(t.replace("|", "\\|") for t in texts) + " |"
            assert _md_unescape(line) in _md_unescape(md), line
    for fig in report["figures"]:
        assert f"(figures/{fig.name})" in md
        assert fig.read_bytes().startswith(PNG_MAGIC)


def _md_unescape(text):
    return text.replace("\\", "")


def test_planted_roles(results_dir):
    c = pd.read_parquet(results_dir / "counts.parquet")
    roles = head_roles(c, 2, 3).set_index("name")
    assert roles.loc["0-0", "role"] == "positional" and roles.loc["0-0", "short"] == "+1"
    assert roles.loc["0-1", "role"] == "coreference"
    assert roles.loc["0-2", "role"] == "broad"
    assert roles.loc["1-0", "role"] == "syntactic" and roles.loc["1-0", "short"] == "det"
    assert roles.loc["1-1", "role"] == "sink"
    assert roles.loc["1-2", "role"] == "syntactic" and roles.loc["1-2", "short"] == "nsubj"


def test_html_is_self_contained(report):
    html = report["html"].read_text(encoding="utf-8")
    assert "<script" not in html and "<link" not in html
    for marker in ('src="http', "src='http", 'href="http', "url(http", "@import"):
        assert marker not in html
    assert html.count('src="data:image/png;base64,') == len(report["figures"])


def test_without_examples_and_cli(tmp_path):
    results = make_results_dir(tmp_path / "res", seed=1, examples=False)
    out = tmp_path / "out"
    assert main_report([str(results), "--out", str(out)]) == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "No examples.json" in html
    assert (out / "report.md").exists() and list((out / "figures").glob("*.png"))
    assert main_report([str(tmp_path / "missing")]) == 2


# ---------------------------------------------------------------- Chromium


def chromium_binary():
    for cand in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    return None


class DevTools:
    """Just enough of a WebSocket client (RFC 6455, text frames) for the DevTools protocol."""

    def __init__(self, ws_url: str, timeout: float = 60.0):
        u = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            head += chunk
        status, _, self._buf = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n")[0]:
            raise ConnectionError(status.decode(errors="replace"))
        self.events: list[dict] = []
        self._id = 0

    def _recv_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _send(self, opcode: int, payload: bytes):
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x80 | opcode])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _recv_message(self) -> dict:
        data = b""
        while True:
            b0, b1 = self._recv_exact(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b1 & 0x80 else None
            payload = self._recv_exact(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:                     # ping
                self._send(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools sent close")
            if opcode in (0x1, 0x2, 0x0):
                data += payload
                if fin:
                    return json.loads(data.decode())

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self._send(0x1, json.dumps({"id": self._id, "method": method, "params": params}).encode())
        while True:
            msg = self._recv_message()
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for msg in self.events:
            if msg.get("method") == method:
                return msg
        while time.monotonic() < deadline:
            msg = self._recv_message()
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        raise TimeoutError(method)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def console_errors(events: list[dict]) -> list[str]:
    errors = []
    for ev in events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                   for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            errors.append(params.get("exceptionDetails", {}).get("text", "exception"))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")
    return errors


def check_page_in_chromium(html_path: Path, screenshot: Path, width: int = 1280,
                           max_height: int = 8000) -> dict:
    """Open `html_path` in headless Chromium; return {"images": [...], "errors": [...]} and
    write a full-page screenshot (at most `max_height` pixels tall)."""
    binary = chromium_binary()
    profile = Path(screenshot).parent / ".chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    profile.mkdir(parents=True)
    proc = subprocess.Popen(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--no-first-run",
         "--no-default-browser-check", "--mute-audio", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0", f"--window-size={width},900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tools = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        targets = json.loads(opener.open(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t.get("type") == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log"):
            tools.call(f"{domain}.enable")
        tools.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                   deviceScaleFactor=1, mobile=False)
        tools.call("Page.navigate", url=Path(html_path).resolve().as_uri())
        tools.wait_event("Page.loadEventFired", timeout=60)
        result = tools.call(
            "Runtime.evaluate", returnByValue=True, awaitPromise=True,
            expression="Promise.all([...document.images].map(i => i.decode().catch(() => 0)))"
                       ".then(() => JSON.stringify({images: [...document.images].map(i => ("
                       "{alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight"
                       "})), height: document.documentElement.scrollHeight,"
                       " external: [...document.querySelectorAll('[src],[href]')]"
                       ".map(e => e.getAttribute('src') || e.getAttribute('href'))"
                       ".filter(u => !u.startsWith('data:') && !u.startsWith('#'))}))")
        info = json.loads(result["result"]["value"])
        height = min(int(info["height"]), max_height)
        shot = tools.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        time.sleep(0.2)                       # let late console events arrive
        tools.sock.settimeout(0.5)
        try:
            while True:
                tools.events.append(tools._recv_message())
        except (socket.timeout, TimeoutError):
            pass
        info["errors"] = console_errors(tools.events)
        try:
            tools.sock.settimeout(10)
            tools.call("Browser.close")
        except (ConnectionError, OSError, RuntimeError):
            pass
        return info
    finally:
        if tools is not None:
            tools.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(chromium_binary() is None, reason="chromium not installed "
                    "(apt-get install chromium)")
def test_report_renders_in_chromium(report):
    screenshot = report["out_dir"] / "report_screenshot.png"
    info = check_page_in_chromium(report["html"], screenshot)
    assert info["images"], "no <img> in the page"
    assert len(info["images"]) == len(report["figures"])
    broken = [i for i in info["images"] if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert not broken, broken
    assert not info["external"], info["external"]
    assert not info["errors"], info["errors"]
    data = screenshot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    # keep the page and its screenshot where CI (and a person) can look at them
    artifacts = Path(os.environ.get("HEADPROBE_ARTIFACTS", Path(__file__).resolve().parents[1] / "results" / "ci"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(screenshot, artifacts / "report_screenshot.png")
    shutil.copy(report["html"], artifacts / "report.html")
