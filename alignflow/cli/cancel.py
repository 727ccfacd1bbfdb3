"""`alignflow cancel RUN`: kill the run's detached jobs through their hosts' transports and mark it cancelled.

- A running run whose controller is alive on this machine: the controller is stopped first (SIGTERM), so that it
  does not launch the next step meanwhile; then `alignflow.runner.control.cancel_run_jobs` kills every job still
  recorded as running and finishes the run `cancelled`.
- A running run driven from another machine: `cancel_run_jobs` all the same (its controller then fails on its
  next write, which the store refuses).
- An `interrupted` run (its controller died): the jobs of the steps that were open when it died are killed, and
  the run becomes `cancelled`, its interruption's reason kept.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import typer

from alignflow.errors import ConfigError

STOP_WAIT_S = 20.0


def kill_interrupted_jobs(store: Any, run_id: str, *, transport_factory: Any) -> list[str]:
    """Cancel the jobs that the open steps of an interrupted run had launched; returns `host: job dir -> state`."""
    from alignflow.runner.recording import recorded_jobs
    from alignflow.runner.session import open_run

    inventory = open_run(store, run_id).inventory
    done = []
    interrupted = {j.step_run_id for j in store.run_jobs(run_id) if j.interrupted}
    for sr in store.steps(run_id):
        jobs = recorded_jobs(sr)
        if sr.id not in interrupted or jobs is None:
            continue
        for handle in jobs.handles:
            transport = transport_factory(inventory.get(handle.host))
            try:
                state = transport.cancel(handle)
            finally:
                transport.close()
            done.append(f"{handle.host}: {handle.job_dir} -> {state.kind}")
    return done


def _stop_controller(run: Any) -> bool:
    from alignflow import controller
    from alignflow.store.interruptions import controller_of

    ident = controller_of(run)
    if ident is None or not controller.terminate(ident, signal.SIGTERM):
        return False
    deadline = time.monotonic() + STOP_WAIT_S
    while controller.liveness(ident) == "alive" and time.monotonic() < deadline:
        time.sleep(0.2)
    if controller.liveness(ident) == "alive":
        controller.terminate(ident, signal.SIGKILL)
    return True


def register(app: typer.Typer) -> None:
    @app.command("cancel")
    def cancel_cmd(
        run_id: str = typer.Argument(..., help="The run to cancel (id or unique prefix)."),
    ) -> None:
        """Kill a run's remote jobs and mark it cancelled (a running or an interrupted run).

        Exit 0 cancelled, 1 when a host cannot be reached, 2 on a usage or configuration error (RUN unknown or not
        running).
        """
        from alignflow.cli.runs import open_store
        from alignflow.runner.control import cancel_run_jobs
        from alignflow.store import RunStatus
        from alignflow.transport import open_transport

        store = open_store(existing=True)
        try:
            run = store.get_run(run_id)
            if run.status == RunStatus.RUNNING:
                if _stop_controller(run):
                    typer.echo(f"run {run.id}: stopped its controller (pid {run.controller['pid']})")  # type: ignore[index]
                killed = cancel_run_jobs(store, run.id, transport_factory=open_transport)
                for job in killed:
                    typer.echo(f"  killed job {job}")
            elif run.status == RunStatus.INTERRUPTED:
                results = kill_interrupted_jobs(store, run.id, transport_factory=open_transport)
                for line in results:
                    typer.echo(f"  {line}")
                store.cancel_interrupted(run.id, note=f"`alignflow cancel` ended {len(results)} job(s)")
            else:
                raise ConfigError(f"run {run.id} is {run.status.value}: nothing to cancel")
            typer.echo(f"run {run.id}: cancelled")
        finally:
            store.close()
