"""Step options out of range are usage errors, refused before anything is recorded or looked up (issue 45, item 3):
`diagnose RUN --step 99` was refused by the diagnose step after preflight and the cache, leaving an `error` run;
`rerun RUN --step S` of a step its pipeline lacks started a Prefect server before the planner refused it (exit 1).

Through the console script's own entry point, on a run the fake lab recorded (`tests/runner/conftest.py`)."""

from __future__ import annotations

import pytest

from alignflow.cli import main
from tests.runner.conftest import FakeLab


def _alignflow(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["alignflow", *args])
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as ended:
        main()
    out = capsys.readouterr()
    code = ended.value.code
    return (code if isinstance(code, int) else 0), out.out + out.err


@pytest.mark.parametrize(("args", "message"), [
    (["diagnose", "{run}", "--step", "99"],
     "error: --step 99: run {run} of tiny: 99 is not a step of the trainings (training.steps: 8); choose a step "
     "from 1 to 8"),
    (["rerun", "{run}", "--step", "convert_hf"],
     "error: tiny has no step 'convert_hf' (its pipeline is derived from its checkpoint formats); its steps are: "),
])
def test_a_step_option_out_of_range_is_exit_2_and_records_nothing(
        args: list[str], message: str, lab: FakeLab, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = lab.start()
    lab.execute(run_id)
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(lab.state))
    before = [r.id for r in lab.store.list_runs()]
    code, output = _alignflow(capsys, monkeypatch, *(a.format(run=run_id) for a in args))
    assert code == 2, output
    assert message.format(run=run_id) in output
    assert "Traceback" not in output
    assert [r.id for r in lab.store.list_runs()] == before  # nothing recorded


def test_diagnose_setup_refuses_a_step_past_the_trainings(lab: FakeLab, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = _alignflow(capsys, monkeypatch, "diagnose-setup", str(lab.experiment), "--dump-path", "/d",
                              "--step", "9", "--out", str(lab.root / "setup"))
    assert code == 2, output
    assert "--step 9: tiny: 9 is not a step of the trainings (training.steps: 8); choose a step from 1 to 8" in output
    assert not (lab.root / "setup").exists()
