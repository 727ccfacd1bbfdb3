"""Every statistic against an independent computation (plain Python over the values as the logs print them)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from alignflow.compare.comparison import compare
from alignflow.compare.statistics import Pairs, error_statistics, perplexity, relative_error, values_at
from alignflow.config.criteria import Criterion
from alignflow.config.statistics import STATISTICS
from alignflow.logs import parse_log
from tests.logfixtures import (
    make_run,
    megatron_lines,
    mindformers_lines,
    perturbed,
    printed_mf,
    printed_mg_norm,
    recovered_mg_loss,
)


def independent(test: Sequence[float], ref: Sequence[float]) -> dict[str, float]:
    """The seeds' definitions written out by hand (docs/seeds.md#error-statistics)."""
    err = [t - r for t, r in zip(test, ref, strict=True)]
    rel = [abs(t - r) / (abs(r) + 1e-8) for t, r in zip(test, ref, strict=True)]
    n = len(err)
    return {
        "me": math.fsum(err) / n, "mean_abs": math.fsum(abs(e) for e in err) / n, "max_error": max(err),
        "min_error": min(err), "max_abs": max(abs(e) for e in err), "mean_rel": math.fsum(rel) / n,
        "max_rel": max(rel),
    }


def test_error_statistics_match_the_definitions_on_random_data() -> None:
    rng = random.Random(7)
    ref = [rng.uniform(-3, 12) for _ in range(997)]
    test = [r + rng.gauss(0, 0.01) for r in ref]
    steps = np.arange(1, 998, dtype=np.int64)
    stats = error_statistics(Pairs(steps, np.array(test), np.array(ref)))
    expected = independent(test, ref)
    for name, value in expected.items():
        assert math.isclose(stats.get(name), value, rel_tol=1e-9, abs_tol=1e-15), name
    assert stats.n == 997
    worst = max(range(997), key=lambda i: abs(test[i] - ref[i]))
    assert stats.step_of("max_abs") == worst + 1


def test_relative_error_uses_the_seed_denominator_floor() -> None:
    rel = relative_error(np.array([1e-9, 2.0]), np.array([0.0, 1.0]))
    assert rel[0] == pytest.approx(1e-9 / 1e-8)
    assert rel[1] == pytest.approx(1.0)


def test_non_finite_pairs_are_left_out_not_absorbed() -> None:
    steps = np.arange(1, 6, dtype=np.int64)
    pairs = Pairs.from_arrays(steps, np.array([1.0, np.nan, 3.0, np.inf, 5.0]), np.array([1.0, 2.0, 2.0, 4.0, 4.0]))
    assert pairs.steps.tolist() == [1, 3, 5]
    stats = error_statistics(pairs)
    assert stats.get("me") == pytest.approx(2 / 3)
    assert values_at(pairs, STATISTICS["step_rel"], [2, 3]) == {2: pytest.approx(float("nan"), nan_ok=True),
                                                   3: pytest.approx(0.5)}


def test_empty_pairs_give_nan_statistics() -> None:
    stats = error_statistics(Pairs(np.array([], dtype=np.int64), np.array([]), np.array([])))
    assert stats.n == 0
    assert math.isnan(stats.get("me"))
    assert stats.step_of("max_abs") is None


def test_perplexity_is_exp_of_the_mean_and_last_loss() -> None:
    steps = np.arange(1, 4, dtype=np.int64)
    p = perplexity(Pairs(steps, np.array([2.0, 2.2, 2.4]), np.array([2.0, 2.1, 2.2])))
    assert p is not None
    assert p.test == pytest.approx(math.exp(2.2))
    assert p.reference == pytest.approx(math.exp(2.1))
    assert p.rel_error == pytest.approx(math.exp(2.2) / math.exp(2.1) - 1)
    assert p.test_final == pytest.approx(math.exp(2.4))


def test_statistics_of_parsed_npu_and_gpu_logs_match_an_independent_computation() -> None:
    ref_run = make_run(400, seed=3)
    test_run = perturbed(ref_run, loss_noise=2e-4, grad_noise=5e-3, seed=4)
    test = parse_log(mindformers_lines(test_run), source="npu.log")
    ref = parse_log(megatron_lines(ref_run), source="gpu.log")
    excluded = Criterion(metric="lm_loss", statistic="mean_rel", threshold=0.01, exclude_steps=[2, 7])
    result = compare(test, ref, [excluded])
    t_loss, r_loss = printed_mf(test_run.lm_loss), recovered_mg_loss(ref_run.lm_loss)
    for name, value in independent(t_loss, r_loss).items():
        assert math.isclose(result.metrics["lm_loss"].stats.get(name), value, rel_tol=1e-9, abs_tol=1e-15), name
    t_norm, r_norm = printed_mf(test_run.grad_norm), printed_mg_norm(ref_run.grad_norm)
    for name, value in independent(t_norm, r_norm).items():
        assert math.isclose(result.metrics["grad_norm"].stats.get(name), value, rel_tol=1e-9, abs_tol=1e-15), name
    keep = [i for i, s in enumerate(ref_run.steps) if s not in (2, 7)]
    expected_excl = independent([t_loss[i] for i in keep], [r_loss[i] for i in keep])["mean_rel"]
    assert math.isclose(result.criteria[0].value, expected_excl, rel_tol=1e-9)
    step1 = abs(t_loss[0] - r_loss[0]) / (abs(r_loss[0]) + 1e-8)
    assert result.metrics["lm_loss"].at_steps["step_rel"] == {1: pytest.approx(step1)}
    ppl = result.metrics["lm_loss"].perplexity
    assert ppl is not None
    assert ppl.test == pytest.approx(math.exp(math.fsum(t_loss) / len(t_loss)))
    assert result.metrics["grad_norm"].perplexity is None


def test_learning_rate_one_step_ahead_is_paired_with_one_step_tolerance() -> None:
    run = make_run(30)
    test = parse_log(mindformers_lines(run))  # prints lr(s + 1), as MindFormers PyNative does
    ref = parse_log(megatron_lines(run))
    aligned = compare(test, ref, [], lr_step_tolerance=1).metrics["lr"]
    assert aligned.shift == 1
    assert aligned.stats.get("max_abs") == pytest.approx(0.0, abs=1e-12)
    assert aligned.stats.n == 29  # the last test step has no reference step s + 1
    strict = compare(test, ref, [], lr_step_tolerance=0).metrics["lr"]
    assert strict.shift == 0
    assert strict.stats.get("max_abs") == pytest.approx(1e-5)


def test_a_different_lr_schedule_is_not_explained_away_by_the_shift() -> None:
    run = make_run(30)
    doubled = replace(run, lr=[2 * v for v in run.lr])
    result = compare(parse_log(megatron_lines(doubled)), parse_log(megatron_lines(run)), [])
    assert result.metrics["lr"].stats.get("max_abs") == pytest.approx(1e-4)
    assert compare(parse_log(megatron_lines(run)), parse_log(megatron_lines(run)), []).metrics["lr"].shift == 0
