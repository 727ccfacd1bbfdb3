"""`alignflow diagnose RUN` without --step re-runs a step where the optimizer has acted (issue 47: step 1, whose
learning rate is 0 in a warm-up from 0, hides every optimizer difference)."""

from __future__ import annotations

from pathlib import Path

from alignflow.cli.diagnose import default_step
from alignflow.config.experiment import load_experiment

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"


def test_the_demo_is_diagnosed_at_step_2_and_says_why() -> None:
    demo = load_experiment(DEMO)
    assert demo.training.lr_warmup_iters == 3
    step, why = default_step(demo)
    assert step == 2
    assert why == "the first step where the optimizer acts (lr 0.000333; step 1 has lr 0 in the warm-up)"


def test_without_a_warm_up_step_1_acts() -> None:
    demo = load_experiment(DEMO)
    flat = demo.model_copy(update={"training": demo.training.model_copy(update={"lr_warmup_iters": 0})})
    assert default_step(flat) == (1, "the first step where the optimizer acts (lr 0.001)")


def test_the_experiments_own_diagnose_step_is_kept() -> None:
    demo = load_experiment(DEMO)
    chosen = demo.model_copy(update={"diagnose": demo.diagnose.model_validate({"step": 5})})
    assert default_step(chosen) == (5, "the experiment's diagnose.step")
