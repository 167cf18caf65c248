"""`shardfeed stats --html` opened in a real browser (issue 23): headless Chromium loads the page
from a file, without a network, and what it rendered is read back: the DOM after the page's
own load handler ran (--dump-dom), and a screenshot. Skipped, with the reason, only where no
Chromium is installed (scripts/install-deps.sh installs Debian's `chromium`); tests/cli/
test_stats.py parses the same page and decodes every image it references either way."""
import html.parser
import os
import shutil
import subprocess

import pytest

from test_stats import corpus, run  # noqa: F401  (the planted-answer archives, module-scoped)

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(BROWSER is None,
                                reason="no chromium on PATH (Debian package `chromium`)")


def chromium(*args, timeout=180):
    # A profile of its own (the test may run as root, beside other sessions); no GPU, no
    # sandbox (containers), a virtual-time budget so the load handler has run before the dump.
    profile = os.environ.get("TMPDIR", "/tmp")
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-dev-shm-usage", "--user-data-dir=%s" % os.path.join(
               profile, "sf-chromium-%d" % os.getpid()),
           "--virtual-time-budget=10000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class _Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.body, self.images, self.groups, self.svgs, self.rects = {}, [], 0, 0, 0
        self.headings, self._h = [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "img":
            self.images.append(a)
        elif tag == "div" and a.get("class") == "group":
            self.groups += 1
        elif tag == "svg":
            self.svgs += 1
        elif tag == "rect":
            self.rects += 1
        elif tag in ("h2", "h3"):
            self._h = ""

    def handle_data(self, data):
        if self._h is not None:
            self._h += data

    def handle_endtag(self, tag):
        if tag in ("h2", "h3") and self._h is not None:
            self.headings.append(self._h.strip())
            self._h = None


def test_chromium_renders_every_histogram_group_and_thumbnail(corpus, tmp_path):  # noqa: F811
    page = tmp_path / "s.html"
    p = run("stats", corpus / "train.sf", "-q", "--html", page, "--against", corpus / "val.sf")
    assert p.returncode == 0, p.stderr
    d = chromium("--dump-dom", page.as_uri())
    assert d.returncode == 0, d.stderr[-2000:]
    dom = _Dom()
    dom.feed(d.stdout)
    # duplicates (4 + 2 cross-label) + near (8) + 5 flagged + 2 leaks side by side (4): every
    # one decoded by the browser itself (naturalWidth > 0), as the page's load handler saw.
    assert len(dom.images) == 4 + 2 + 8 + 5 + 4, d.stdout[:2000]
    assert dom.body.get("data-images") == "23/23", dom.body
    assert all(img.get("data-decoded") == "1" for img in dom.images)
    # Histograms: width, height, aspect and record bytes, one bar per bin.
    assert dom.svgs == 4 and dom.rects >= 4 * 8
    # Groups: 2 exact (one across labels, listed twice), 4 near, 2 leaked pairs.
    assert dom.groups == 2 + 1 + 4 + 2, dom.groups
    for title in ("Exact duplicates (2 groups)", "Duplicates across labels (1 groups)",
                  "Near duplicates (4 groups)", "Leaks (2)", "dark (1)", "uniform (1)"):
        assert title in dom.headings, (title, dom.headings)


def test_chromium_screenshot_shows_the_histograms(corpus, tmp_path):  # noqa: F811
    from PIL import Image
    page = tmp_path / "s.html"
    assert run("stats", corpus / "train.sf", "-q", "--html", page).returncode == 0
    shot = tmp_path / "shot.png"
    s = chromium("--screenshot=%s" % shot, "--window-size=1200,1600", page.as_uri())
    assert shot.exists(), s.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 1600)
    # The bars are drawn in #4a7ab5: a page that did not render has none of that colour.
    bars = sum(1 for px in img.getdata() if px == (0x4a, 0x7a, 0xb5))
    assert bars > 500, bars
