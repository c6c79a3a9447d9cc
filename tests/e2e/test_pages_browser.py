"""The HTML pages in a real browser (headless Chromium): what an on-call engineer sees of an unhealthy GPU.

After XID 79 on GPU 1 (and XID 13 on GPU 6) through the simulator, the page Chromium renders must show GPU 1
unhealthy with REBOOT_NODE and a runbook link that opens a page naming GPU 1, and its screenshot must show
the red of an unhealthy GPU where the healthy page had none. `pytest --update-screenshots` writes the
screenshots into docs/images/, where the README shows them.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.conftest import REPO, require_tool
from tests.daemon_proc import Daemon, serve, wait_for

pytestmark = pytest.mark.e2e

IMAGES = REPO / "docs" / "images"
UNHEALTHY_RED = (0xC0, 0x39, 0x2B)  # the unhealthy and critical badges (exporter/http/page.py)
SIZE = (1200, 1150)


def chromium(url: str, *, screenshot: Path | None = None, size: tuple[int, int] = SIZE) -> str:
    """The DOM Chromium built for `url`, or (with `screenshot`) a PNG of it; a fresh profile each time."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            require_tool("chromium"),
            "--headless",
            "--no-sandbox",  # the tests may run as root
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={screenshot}" if screenshot else "--dump-dom",
            url,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@dataclass
class Row:
    classes: str
    cells: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " | ".join(self.cells)


class GpuTable(HTMLParser):
    """The rows of the landing page's GPU table, as text per cell and the links in them."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.rows: list[Row] = []
        self._in_table = False
        self._cell: list[str] | None = None
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._in_table = a.get("id") == "gpus"
        elif self._in_table and tag == "tr" and a.get("class"):
            self.rows.append(Row(a["class"] or ""))
        elif self._in_table and tag == "td" and self.rows:
            self._cell = []
        elif self._cell is not None and tag == "a" and a.get("href"):
            self.rows[-1].links.append(a["href"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1].cells.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def gpu(self, index: int) -> Row:
        return next(r for r in self.rows if r.cells and r.cells[0] == f"GPU {index}")


def red_pixels(png: Path) -> int:
    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    return sum(count for count, colour in colours if colour == UNHEALTHY_RED)


def inject(daemon: Daemon, gpu: int, xid: int) -> None:
    httpx.post(f"{daemon.url}/api/v1/sim/faults", json={"gpu": gpu, "kind": "xid", "xid": xid}).raise_for_status()


def test_an_unhealthy_gpu_in_the_browser(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    require_tool("chromium")
    shots = tmp_path / "shots"
    shots.mkdir()
    with serve(tmp_path / "daemon") as daemon:
        chromium(f"{daemon.url}/", screenshot=shots / "healthy.png")
        assert red_pixels(shots / "healthy.png") == 0
        healthy = GpuTable(chromium(f"{daemon.url}/"))
        assert len(healthy.rows) == 8 and all(r.classes == "gpu-healthy" for r in healthy.rows)

        inject(daemon, 1, 79)
        inject(daemon, 6, 13)

        def settled() -> bool:
            gpus = httpx.get(f"{daemon.url}/api/v1/diagnosis").json()["gpus"]
            return [g["health"] for g in gpus if g["gpu"] in (1, 6)] == ["unhealthy", "degraded"]

        wait_for(settled, 15, interval=0.1, what="GPU 1 unhealthy and GPU 6 degraded")
        page = GpuTable(chromium(f"{daemon.url}/"))
        one = page.gpu(1)
        assert one.classes == "gpu-unhealthy"
        assert one.cells[1:3] == ["unhealthy", "REBOOT_NODE"], one.text
        assert "The GPU fell off the PCIe bus" in one.cells[3] and one.cells[4].startswith("Xid 79")
        assert "/runbooks/xid-79" in one.links
        six = page.gpu(6)
        assert (six.classes, six.cells[1], six.cells[2]) == ("gpu-degraded", "degraded", "CHECK_APP")
        assert all(page.gpu(i).cells[1] == "healthy" for i in (0, 2, 3, 4, 5, 7))

        # The runbook link works, and the page it opens names the GPU; so does the runbook index.
        runbook = chromium(f"{daemon.url}/runbooks/xid-79")
        assert "Live on this node now (1)" in runbook and "GPU 1 (0000:2a:00.0)" in runbook
        index = chromium(f"{daemon.url}/runbooks/")
        live_box = index.split('class="live"', 1)[1].split("</section>", 1)[0]
        assert "GPU 1 (0000:2a:00.0)" in live_box and "GPU 6 (0000:ba:00.0)" in live_box

        chromium(f"{daemon.url}/", screenshot=shots / "gpu-triage-landing.png")
        chromium(f"{daemon.url}/runbooks/xid-79", screenshot=shots / "gpu-triage-runbook.png", size=(1200, 900))
    for name in ("gpu-triage-landing.png", "gpu-triage-runbook.png"):
        with Image.open(shots / name) as image:
            assert image.size == (SIZE[0], SIZE[1] if "landing" in name else 900)
        assert red_pixels(shots / name) > 500, f"{name}: no unhealthy red on screen"
        if request.config.getoption("--update-screenshots"):
            IMAGES.mkdir(parents=True, exist_ok=True)
            (IMAGES / name).write_bytes((shots / name).read_bytes())
