"""What the report's plots show, read from the figures themselves (not their pixels): each plot says what it
draws, the same statistic the tables use, on an honest axis, with its legend beside the data, never over it."""
from __future__ import annotations

from typing import Any

import pytest
from matplotlib.colors import to_hex

from specab.analysis.measures import phases, stats
from specab.analysis.render import report
from tests.analysis import factory as F


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure a plot function draws, drawn (so legends and axes have their final places) before it is closed."""
    drawn: list[Any] = []
    to_png = report._fig_png

    def keep(fig: Any) -> bytes:
        fig.draw_without_rendering()
        drawn.append(fig)
        return to_png(fig)
    monkeypatch.setattr(report, "_fig_png", keep)
    return drawn


def _legend_beside_the_axes(fig: Any) -> list[str]:
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None, "the plot has no legend"
    box, area = legend.get_window_extent(), ax.get_window_extent()
    assert box.x0 >= area.x1, (box, area)            # right of the axes: it covers no data
    return [t.get_text() for t in legend.get_texts()]


def test_tok_s_per_arm_is_from_zero_with_the_tables_median_and_interval(figures) -> None:
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=6, accept={"eagle3-s2": 2.1})
    st = stats.analyse(exp)
    report.plot_tok_s(exp, st)
    [fig] = figures
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0                      # a 5 % gap looks like 5 %, not like a cliff
    from matplotlib.collections import PathCollection
    medians = [c for c in ax.collections        # the blue diamonds, one per arm in arm order
               if isinstance(c, PathCollection) and to_hex(c.get_facecolor()[0]) == "#0969da"]
    assert [round(float(c.get_offsets()[0][1]), 6) for c in medians] == \
        [round(st.arms[a.name].tok_s_run.median, 6) for a in exp.arms]
    from matplotlib.collections import LineCollection
    intervals = [seg for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]
    assert [tuple(round(float(y), 6) for y in seg[:, 1]) for seg in intervals] == \
        [(round(st.arms[a.name].tok_s_run.ci.lo, 6), round(st.arms[a.name].tok_s_run.ci.hi, 6)) for a in exp.arms]
    labels = _legend_beside_the_axes(fig)
    assert labels == ["one run", "median over runs", "95% interval (Arms table)"]


def test_gpu_clocks_explain_every_shading_and_draw_identical_gpus_as_one_line(figures) -> None:
    def same(run, arm):
        w = run.window
        run.gpu_samples = F.gpu_samples(w[0], w[1], n=20, gpus=8)
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, tweak=same)
    report.plot_gpu_clocks(exp)
    labels = _legend_beside_the_axes(figures[-1])
    assert labels == ["all 8 GPUs (identical)", "measured window, baseline", "measured window, other arms",
                      "max SM clock"]
    assert len(figures[-1].axes[0].lines) == 2       # one series for eight identical GPUs, and the max clock

    def sixteen(run, arm):                            # more GPUs than the legend names: still every shading said
        w = run.window
        run.gpu_samples = F.gpu_samples(w[0], w[1], n=20, gpus=16)
        for s in run.gpu_samples:
            s.sm_mhz = 1980.0 - s.index
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, tweak=sixteen)
    report.plot_gpu_clocks(exp)
    assert _legend_beside_the_axes(figures[-1]) == [
        "16 GPUs, coloured by index (dark: first, light: last)", "measured window, baseline",
        "measured window, other arms", "max SM clock"]
    gpu_lines = figures[-1].axes[0].lines[:-1]
    assert len(gpu_lines) == 16 and len({to_hex(line.get_color()) for line in gpu_lines}) == 16   # none shares one


def test_gpu_clocks_name_each_group_of_identical_gpus_and_give_every_series_its_own_colour(figures) -> None:
    def two_differ(run, arm):                         # GPUs 0-5 alike, 6 and 7 each their own clock
        w = run.window
        run.gpu_samples = F.gpu_samples(w[0], w[1], n=20, gpus=8)
        for s in run.gpu_samples:
            s.sm_mhz = 1980.0 - 10 * max(0, s.index - 5)
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, tweak=two_differ)
    report.plot_gpu_clocks(exp)
    assert _legend_beside_the_axes(figures[-1])[:3] == ["GPUs 0-5 (identical)", "GPU 6", "GPU 7"]
    lines = figures[-1].axes[0].lines[:-1]
    assert [sorted({round(float(y)) for y in line.get_ydata()}) for line in lines] == [[1980], [1970], [1960]]
    assert len({to_hex(line.get_color()) for line in lines}) == 3


def test_baseline_over_time_and_cycle_phases_keep_their_legends_off_the_data(figures) -> None:
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=6, accept={"eagle3-s2": 2.1},
                       drift_per_run=-0.3)
    report.plot_baseline_over_time(exp, stats.analyse(exp))
    assert _legend_beside_the_axes(figures[-1])[:2] == ["baseline", "eagle3-s2"]
    iv = phases.Interval(10.0, 9.0, 11.0, 3)
    arm = phases.ArmPhases("eagle3-s2", [], iv, phases.Interval(2.0, 1.5, 2.5, 3), phases.Interval(20.0, 19.0, 21.0, 3),
                           phases.Interval(1.0, 0.8, 1.2, 3), phases.Interval(33.0, 32.0, 34.0, 3), 0.0, 12.2, None)
    report.plot_phases(phases.PhaseReport(arms={"eagle3-s2": arm}))
    assert set(_legend_beside_the_axes(figures[-1])) == {"draft", "draft-extend", "verify", "other", "baseline step"}
