"""`report` writes report.md and a self-contained report.html whose plots render in headless Chromium."""
import base64
import io
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specab.analysis.render import report
from tests.analysis import factory as F

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
PLOTS = {"tok/s per arm with 95% intervals", "speedup vs steps with the model's prediction",
         "accept length vs break-even", "baseline over time", "GPU clocks during runs"}


class Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.external = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        for k in ("src", "href"):
            if a.get(k) and not a[k].startswith("data:"):
                self.external.append(a[k])


@pytest.fixture(scope="module")
def exp_dir(tmp_path_factory):
    def hot(run, arm):      # one throttled baseline run, so the doctor has something to say
        if run.block == 1 and not arm.is_spec:
            w = run.window
            run.gpu_samples = F.gpu_samples(w[0], w[1], sm=1600, reasons=0x20)
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5, "eagle3-s3": 60.0}, blocks=4,
                       accept={"eagle3-s2": 2.1, "eagle3-s3": 2.3}, tweak=hot)
    return F.write_store(exp, tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def written(exp_dir):
    r = subprocess.run([sys.executable, "driver.py", "report", str(exp_dir), "--target-tok-s", "150"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_report_command_prints_the_summary_and_writes_both_files(exp_dir, written):
    assert "eagle3-s2 vs baseline: slower" in written
    assert "doctor: " in written and "gpu-throttled" in written      # the summary names the rules that fired
    md = (exp_dir / "report.md").read_text()
    assert "## Speedup (paired within blocks)" in md and "tau*" in md
    assert "gpu-throttled" in md and "SwThermalSlowdown" in md
    assert "Target 150 tok/s" in md
    for m in re.findall(r"!\[[^\]]*\]\((report/[^)]+)\)", md):
        assert (exp_dir / m).is_file()


def test_report_html_is_self_contained_with_every_plot(exp_dir, written):
    from PIL import Image
    page = (exp_dir / "report.html").read_text()
    p = Imgs()
    p.feed(page)
    assert p.external == []                                 # nothing fetched from anywhere
    assert {i["alt"] for i in p.imgs} == PLOTS
    for i in p.imgs:
        assert i["src"].startswith("data:image/png;base64,")
        img = Image.open(io.BytesIO(base64.b64decode(i["src"].split(",", 1)[1])))
        assert img.size[0] > 300 and img.size[1] > 200
        assert len(set(img.convert("L").tobytes())) > 10    # a real plot, not an empty canvas


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_report_html_renders_in_headless_chromium(exp_dir, written, tmp_path):
    from PIL import Image
    shot = tmp_path / "report.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
           "--window-size=1200,12000", "--hide-scrollbars", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", (exp_dir / "report.html").as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 12000)
    # non-blank: many colours, and the plots' blue/red lines are present somewhere on the page
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200
    px = img.resize((300, 3000)).tobytes()
    assert any(px[i + 2] > 150 and px[i] < 100 for i in range(0, len(px), 3))    # plot blue (#0969da)


def test_failed_and_unpaired_runs_are_reported_not_hidden():
    def crash(run, arm):
        if run.block == 2 and arm.is_spec:
            run.status, run.requests, run.error = "failed", [], "Ready | CUDA out of memory while loading"
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=4, accept={"eagle3-s2": 2.1}, tweak=crash)
    rep = report.build_report(exp, plots=False)
    md = report.to_markdown(rep)
    assert "1 run(s) failed or measured nothing" in md and "CUDA out of memory" in md
    assert "over 3 paired block(s)" in md                       # the block without a spec run is not paired
    html_text = report.to_html(rep)
    assert "<script" not in html_text and "CUDA out of memory" in html_text


# ------------------------------------------------------------------ GPU clocks of many samples (benchmark 5)

def _png_pixels(png: bytes):
    from matplotlib import image as mpimg
    return mpimg.imread(io.BytesIO(png))


def test_gpu_clock_plot_of_distinct_points_is_the_plot_of_every_sample():
    """The plot draws only the samples that land on distinct points of a grid finer than its pixels: the
    picture is the one every sample draws, throttled outliers included, and the outliers are kept."""
    import numpy as np

    def many(run, arm):
        w = run.window
        run.gpu_samples = F.gpu_samples(w[0], w[1], n=400, gpus=8)
        if run.seq % 5 == 0:
            for s in run.gpu_samples[::37]:
                s.sm_mhz = 1350.0 if s.index % 2 else 990.0
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=12, accept={"eagle3-s2": 2.1}, tweak=many)
    assert sum(len(r.gpu_samples) for r in exp.runs) == 24 * 400 * 8
    every, fast = _png_pixels(report.plot_gpu_clocks(exp, grid=None)), _png_pixels(report.plot_gpu_clocks(exp))
    assert every.shape == fast.shape
    diff = np.abs(every - fast).max(axis=-1)
    assert (diff > 0.1).mean() < 0.002, f"{int((diff > 0.1).sum())} pixels differ"

    def ink(img):                                    # markers, lines, text (not the white or shaded background)
        return img[..., :3].max(axis=-1) < 0.6

    def grown(mask):                                 # the mask and its 8 neighbours
        out = mask.copy()
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                out |= np.roll(np.roll(mask, dy, axis=0), dx, axis=1)
        return out
    # what differs is the antialiased rim of a marker (many overlapping copies shade it darker), never a marker:
    # every inked pixel of one plot is within a pixel of ink in the other
    assert ink(every).sum() > 5000
    assert not (ink(every) & ~grown(ink(fast))).any() and not (ink(fast) & ~grown(ink(every))).any()
    assert not ((diff > 0.1) & ~grown(ink(every) | ink(fast))).any()


def test_distinct_points_keeps_every_outlier_and_drops_only_repeats():
    import numpy as np
    x = np.repeat(np.arange(10_000) / 100.0, 8)          # 8 GPUs' samples at the same times
    y = np.full(len(x), 1980.0)
    y[[5, 40_000, 79_999]] = [990.0, 1350.0, 1979.0]
    keep = report.distinct_points(x, y)
    assert {5, 40_000, 79_999} <= set(keep.tolist())
    assert len(keep) <= 2 * report.PLOT_GRID[0] + 3 and list(keep) == sorted(keep)
    assert len(report.distinct_points(x[:0], y[:0])) == 0
    one = report.distinct_points([1.0, 1.0], [5.0, 5.0])
    assert one.tolist() == [0]


def test_an_engine_ab_gets_one_speedup_and_one_spec_model_per_build():
    """Each build's arms against its own baseline, in the speedup table and the spec model."""
    from specab.analysis.evidence.model import Arm
    from tests.analysis import factory as F
    arm_list = [Arm(f"baseline-{b}", dict(F.BASE_ARGS), dict(F.TUNED), baseline=f"baseline-{b}") for b in ("a", "b")]
    arm_list += [Arm(f"eagle3-s2-{b}", F.spec_args(2), dict(F.TUNED), baseline=f"baseline-{b}") for b in ("a", "b")]
    exp = F.experiment({"baseline-a": 82.0, "eagle3-s2-a": 95.0, "baseline-b": 60.0, "eagle3-s2-b": 66.0},
                       blocks=3, arm_list=arm_list)
    exp.baseline = "baseline-a"
    md = report.to_markdown(report.build_report(exp, plots=False))
    assert "## Speculative-decoding model vs baseline-a" in md and "## Speculative-decoding model vs baseline-b" in md
    assert re.search(r"\| eagle3-s2-b \| baseline-b \| 3 \| 1\.1\d\d \|", md), md
    assert re.search(r"\| eagle3-s2-a \| baseline-a \| 3 \| 1\.1\d\d \|", md)
