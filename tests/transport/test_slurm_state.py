"""Reading Slurm's answers into job states: the parsers, on what the lab's real Slurm 22.05 printed
(tests/data/slurm/README.md), and the batch script a Slurm job gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config.slurm import SlurmConfig, format_minutes, slurm_minutes
from alignflow.transport.jobs import JobState
from alignflow.transport.slurm import render_batch_script, sbatch_lines
from alignflow.transport.slurm_state import (
    StatusAnswer,
    exit_status,
    from_sacct,
    from_scontrol,
    interpret,
    parse_answers,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def _line(name: str) -> str:
    return (DATA / f"scontrol_{name}.txt").read_text().strip()


@pytest.mark.parametrize(("name", "kind", "code", "note"), [
    ("pending", "pending", None, "Slurm PENDING in partition debug: Nodes required for job are DOWN, DRAINED or "
     "reserved for jobs in higher priority partitions"),
    ("running", "running", None, ""),
    ("completed", "exited", 0, ""),
    ("failed", "exited", 3, ""),
    ("signalled", "exited", 137, ""),  # the batch script killed by SIGKILL: 128 + 9, as bash reports it
    ("cancelled", "cancelled", 143, "Slurm CANCELLED"),
    ("preempted", "preempted", 143, "Slurm PREEMPTED"),
    ("timeout", "timeout", 143, "Slurm TIMEOUT: ran 00:01:25 of its 00:01:00 time limit"),
])
def test_each_slurm_state_reads_as_our_job_state(name: str, kind: str, code: int | None, note: str) -> None:
    state = from_scontrol(_line(name))
    assert (state.kind, state.exit_code, state.note) == (kind, code, note)
    assert state.finished == (kind not in ("pending", "running"))
    assert state.ok == (name == "completed")


def test_slurms_exit_code_is_the_status_or_128_plus_the_signal() -> None:
    assert [exit_status(c) for c in ("0:0", "3:0", "0:9", "0:15", "1:15", "garbage")] == [0, 3, 137, 143, 1, None]


def test_sacct_lines_are_read_for_the_job_asked_for() -> None:
    # sacct -n -P -X -o JobIDRaw,State,ExitCode,Reason: no header, '|' between fields (`man sacct`, --parsable2)
    text = "11|COMPLETED|0:0|None\n12|CANCELLED by 1000|0:15|None\n13|TIMEOUT|0:15|TimeLimit\n"
    assert from_sacct(text, "11") is not None
    assert from_sacct(text, "11").ok
    cancelled = from_sacct(text, "12")
    assert cancelled is not None
    assert (cancelled.kind, cancelled.note) == ("cancelled", "Slurm CANCELLED by 1000")
    timeout = from_sacct(text, "13")
    assert timeout is not None
    assert timeout.kind == "timeout"
    assert from_sacct(text, "14") is None


def _forgotten(*, sacct_rc: int | None, sacct: str, exit_file: str | None) -> StatusAnswer:
    return StatusAnswer(1, (DATA / "scontrol_unknown.txt").read_text().strip(), sacct_rc, sacct, exit_file)


def test_a_job_the_controller_forgot_is_read_from_accounting_then_from_its_exit_code_file() -> None:
    disabled = (DATA / "sacct_disabled.txt").read_text().strip()
    state, _ = interpret(_forgotten(sacct_rc=0, sacct="7|FAILED|2:0|NonZeroExitCode", exit_file="2"), "7")
    assert state is not None
    assert (state.kind, state.exit_code) == ("exited", 2)
    state, _ = interpret(_forgotten(sacct_rc=1, sacct=disabled, exit_file="0"), "7")
    assert state is not None
    assert state.ok
    assert state.note == "from the job's exit_code file"


def test_a_forgotten_job_without_accounting_or_exit_code_is_lost_saying_why() -> None:
    disabled = (DATA / "sacct_disabled.txt").read_text().strip()
    state, _ = interpret(_forgotten(sacct_rc=1, sacct=disabled, exit_file=None), "7")
    assert state is not None
    assert state.kind == "lost"
    assert "Invalid job id specified" in state.note
    assert "accounting storage is disabled" in state.note


def test_an_unreachable_controller_is_no_verdict_on_the_job() -> None:
    answer = StatusAnswer(1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)", None, "",
                          "1")
    state, why = interpret(answer, "7")
    assert state is None
    assert "did not answer" in why


def test_slurm_time_formats_round_up_to_minutes_like_slurm() -> None:
    assert [slurm_minutes(t) for t in ("1", "0:30", "01:00:01", "2-00", "1-01:30", "1-00:00:59")] == [
        1, 1, 61, 2880, 1530, 1441]
    assert format_minutes(61) == "01:01:00"
    assert format_minutes(1441) == "1-00:01:00"
    with pytest.raises(ValueError, match="not a Slurm time"):
        slurm_minutes("1h")


def test_the_step_limit_caps_the_hosts_time_limit_when_shorter() -> None:
    config = SlurmConfig(time_limit="02:00:00")
    assert config.time_limit_minutes(None) == 120
    assert config.time_limit_minutes(600.0) == 10
    assert config.time_limit_minutes(3 * 3600.0) == 120
    assert SlurmConfig().time_limit_minutes(None) is None


def test_options_alignflow_owns_cannot_be_given_as_extra_lines() -> None:
    with pytest.raises(ValueError, match="set by alignflow itself"):
        SlurmConfig(extra=["--output=/tmp/x"])
    with pytest.raises(ValueError, match="starting with '-'"):
        SlurmConfig(extra=["exclusive"])
    with pytest.raises(ValueError, match="becomes an #SBATCH line"):
        SlurmConfig(partition="gpu\n#SBATCH --uid=0")


def test_the_batch_script_carries_every_hosts_yaml_setting_in_order() -> None:
    config = SlurmConfig(partition="gpu", account="proj", qos="high", nodes=2, gpus_per_node=8, cpus_per_task=16,
                         mem="64G", time_limit="04:00:00", extra=["--exclusive", "--constraint=h200"])
    script = render_batch_script(config, name="run1-gpu_train", header="alignflow job x", time_minutes=90)
    assert script == (
        "#!/bin/bash\n"
        "#SBATCH --job-name=run1-gpu_train\n"
        "#SBATCH --output=stdout\n"
        "#SBATCH --error=stderr\n"
        "#SBATCH --open-mode=append\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --gpus-per-node=8\n"
        "#SBATCH --cpus-per-task=16\n"
        "#SBATCH --mem=64G\n"
        "#SBATCH --partition=gpu\n"
        "#SBATCH --account=proj\n"
        "#SBATCH --qos=high\n"
        "#SBATCH --time=01:30:00\n"
        "#SBATCH --exclusive\n"
        "#SBATCH --constraint=h200\n"
        "# alignflow job x\n"
        "bash ./cmd.sh < /dev/null\n"
        "code=$?\n"
        'echo "$code" > exit_code.tmp && mv -f exit_code.tmp exit_code\n'
        'exit "$code"\n')
    assert sbatch_lines(SlurmConfig(), name="n", time_minutes=None) == [
        "--job-name=n", "--output=stdout", "--error=stderr", "--open-mode=append", "--nodes=1", "--ntasks-per-node=1"]


def test_the_status_command_answers_each_job_with_the_one_accounting_answer() -> None:
    disabled = (DATA / "sacct_disabled.txt").read_text().strip()
    answers = parse_answers(f"@@ SACCT 1\n{disabled}\n@@ JOB 5\n@@ SCONTROL 0\n{_line('running')}\n"
                            f"@@ JOB 6\n@@ SCONTROL 1\n{_forgotten(sacct_rc=1, sacct='', exit_file=None).scontrol}\n"
                            "@@ EXITFILE 0\n3\n")
    assert interpret(answers["5"], "5") == (JobState("running"), "")
    assert interpret(answers["6"], "6")[0] == JobState("exited", 3, note="from the job's exit_code file")
    assert answers["6"].sacct == disabled
    known = parse_answers("@@ SACCT 0\n5|PENDING|0:0|Priority|debug|00:00:00|01:00:00\n"
                          "6|TIMEOUT|0:15|TimeLimit|debug|01:00:31|01:00:00\n@@ JOB 5\n@@ JOB 6\n")
    assert interpret(known["5"], "5")[0] == JobState("pending", note="Slurm PENDING in partition debug: Priority")
    assert interpret(known["6"], "6")[0] == JobState("timeout", 143,
                                                     note="Slurm TIMEOUT: ran 01:00:31 of its 01:00:00 time limit")
