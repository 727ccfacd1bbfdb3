"""A failing curve's band stays visible (issue 47): where the error dwarfs the band, both figures add |error| in band
widths on a log axis, the band's edge at 1; where the band shows at the error's scale, they do not. Figures are
built, not rendered."""

from __future__ import annotations

import numpy as np
import pytest

from alignflow.compare import interactive, plots
from alignflow.compare.comparison import Comparison, compare
from alignflow.compare.divergence import BAND_VISIBLE_SHARE, PULL_FLOOR, Band, in_band_widths
from alignflow.config.criteria import default_criteria
from alignflow.logs import parse_log
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed


def _compare(offset: float) -> Comparison:
    ref = make_run(40, seed=31)
    test = perturbed(ref, loss_noise=1e-4, loss_offset=offset, seed=33)
    return compare(parse_log(mindformers_lines(test)), parse_log(megatron_lines(ref)), default_criteria())


def test_the_ratio_is_given_only_where_the_band_would_be_a_hairline() -> None:
    b = Band(steps=np.array([1, 2, 3]), width=np.array([1e-3, np.inf, 1e-3]), source=(None, None, None))
    steps = np.array([1, 2, 3, 4])
    wide = in_band_widths(b, steps, np.array([0.5, 0.5, 0.0, 0.5]))
    assert wide is not None
    assert np.allclose(wide, [500.0, np.nan, PULL_FLOOR, np.nan], equal_nan=True), wide  # no band at steps 2, 4
    assert in_band_widths(b, steps, np.full(4, 1e-3 / BAND_VISIBLE_SHARE * 0.99)) is None  # the band shows: 5%
    assert in_band_widths(None, steps, np.full(4, 1.0)) is None


def test_a_failing_curve_gets_a_log_panel_of_its_error_in_band_widths() -> None:
    failing = _compare(0.5)  # |error| ~0.5 against a band of 0.001: 1/500 of the error axis
    assert failing.verdict == "fail"
    fig = interactive.metric_figure([failing], "lm_loss", ("NPU", "GPU"))
    assert fig["layout"]["yaxis3"]["type"] == "log"
    pull = next(t for t in fig["data"] if t.get("name") == "|error NPU| / band")
    assert pull["yaxis"] == "y3"
    assert np.nanmin(pull["y"]) == pytest.approx(500, rel=0.01)
    assert any(s.get("yref") == "y3" and s["y1"] == 1 for s in fig["layout"]["shapes"])  # the band's edge
    figure = plots.metric_figure([failing], "lm_loss", labels=("NPU", "GPU"))
    assert len(figure.axes) == 3
    assert figure.axes[2].get_yscale() == "log"


def test_a_curve_whose_band_shows_keeps_two_panels() -> None:
    passing = _compare(0.0)
    assert "yaxis3" not in interactive.metric_figure([passing], "lm_loss", ("NPU", "GPU"))["layout"]
    assert len(plots.metric_figure([passing], "lm_loss", labels=("NPU", "GPU")).axes) == 2
