"""docker/: the compose file validated by the compose client, its pieces exercised where Docker is not needed.

No Docker engine runs on these machines: `docker compose config` (or Debian's `docker-compose config`, which
`.ci/run` installs) validates and normalises the file; the PostgreSQL init script runs against the lab server;
the lab's key script, sshd config and inventory are checked with the real OpenSSH tools and alignflow's loader.
The topology itself runs without Docker in test_team.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml

from alignflow.config.hosts import load_hosts
from tests.lab.postgres import SERVER_USER, PostgresServer
from tests.lab.sshd import ensure_privsep_dir

pytestmark = pytest.mark.integration


def compose_command() -> list[str]:
    """`docker compose` where the plugin is installed, else `docker-compose` (Debian's package)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    pytest.fail("no compose client: install the docker compose plugin or Debian's docker-compose (.ci/run does)",
                pytrace=False)


def compose_config(repo_root: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POSTGRES_", "ALIGNFLOW_", "COMPOSE_"))}
    return subprocess.run([*compose_command(), "-f", str(repo_root / "docker" / "compose.yaml"), *extra, "config"],
                          env={**environ, **(env or {})}, capture_output=True, text=True, timeout=120, check=False)


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of a service's volumes, from the short syntax (docker-compose 1.x prints) or the long one
    (the compose plugin prints)."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = str(v.get("source", ""))
        else:
            source, target = v.split(":")[:2]
            out[target] = source
    return out


@pytest.fixture(scope="module")
def config(repo_root: Path) -> dict[str, Any]:
    done = compose_config(repo_root, "--profile", "lab", env={"POSTGRES_PASSWORD": "s3cret"})
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout))


def test_compose_file_is_valid_and_has_the_team_topology(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) == {"postgres", "prefect-server", "worker", "reports", "lab-ascend", "lab-cpu", "lab-cuda"}
    server, worker = services["prefect-server"], services["worker"]
    # Prefect's database and alignflow's store: two databases on the one PostgreSQL service
    assert server["environment"]["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == (
        "postgresql+asyncpg://alignflow:s3cret@postgres:5432/prefect")
    assert worker["environment"]["ALIGNFLOW_DB_URL"] == "postgresql+psycopg://alignflow:s3cret@postgres:5432/alignflow"
    assert services["postgres"]["environment"]["POSTGRES_DB"] == "prefect"
    assert services["postgres"]["environment"]["ALIGNFLOW_DB"] == "alignflow"
    assert worker["environment"]["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert worker["command"][:2] == ["alignflow", "serve"]
    assert worker["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert worker["stop_signal"] == "SIGTERM"
    # the worker and the server are one image (one Prefect pin); the lab hosts build on it
    assert server["build"]["dockerfile"] == worker["build"]["dockerfile"] == "docker/Dockerfile"
    for name in ("lab-ascend", "lab-cpu", "lab-cuda"):
        assert services[name]["build"]["dockerfile"] == "docker/sshd.Dockerfile"
        assert services[name]["profiles"] == ["lab"]
        assert mounts(services[name])["/etc/alignflow-lab"].endswith(f"docker/lab/keys/{name}")


def test_compose_refuses_to_start_without_a_database_password(repo_root: Path) -> None:
    done = compose_config(repo_root)
    assert done.returncode != 0
    assert "set POSTGRES_PASSWORD in docker/.env" in done.stderr


def test_dockerfiles_copy_only_files_that_exist_and_are_not_ignored(repo_root: Path) -> None:
    for dockerfile in ("Dockerfile", "sshd.Dockerfile"):
        text = (repo_root / "docker" / dockerfile).read_text()
        allowed = [line[1:].rstrip("/") for line in (repo_root / "docker" / f"{dockerfile}.dockerignore")
                   .read_text().splitlines() if line.startswith("!")]
        sources = [part for line in text.splitlines() if line.startswith("COPY ")
                   for part in line.split()[1:-1] if not part.startswith("--")]
        assert sources
        for src in sources:
            assert (repo_root / src).exists(), f"{dockerfile}: COPY {src}: not in the repository"
            assert any(src == a or src.startswith(a + "/") for a in allowed), f"{dockerfile}: {src} is ignored"


def test_postgres_init_script_creates_the_store_database_beside_prefects(postgres_server: PostgresServer,
                                                                          repo_root: Path) -> None:
    import psycopg

    prefect_db = f"prefect_{os.getpid()}"
    store_db = f"alignflow_{os.getpid()}"
    postgres_server.create_database(prefect_db)
    try:
        env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(postgres_server.port), "POSTGRES_USER": SERVER_USER,
               "POSTGRES_DB": prefect_db, "ALIGNFLOW_DB": store_db}
        done = subprocess.run(["sh", str(repo_root / "docker" / "postgres-init" / "10-alignflow.sh")], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        with psycopg.connect(host="127.0.0.1", port=postgres_server.port, user=SERVER_USER, dbname=prefect_db) as c:
            assert c.execute("select 1 from pg_extension where extname = 'pg_trgm'").fetchone() == (1,)
            assert c.execute("select 1 from pg_database where datname = %s", (store_db,)).fetchone() == (1,)
    finally:
        postgres_server.drop_database(store_db)
        postgres_server.drop_database(prefect_db)


def test_lab_keys_sshd_config_and_inventory_fit_together(tmp_path: Path, repo_root: Path) -> None:
    lab = tmp_path / "lab"
    shutil.copytree(repo_root / "docker" / "lab", lab, ignore=shutil.ignore_patterns("keys"))
    done = subprocess.run(["bash", str(lab / "make-keys.sh")], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    known = paramiko.HostKeys(str(lab / "keys" / "known_hosts"))
    inventory = load_hosts(lab / "hosts.yaml")
    assert {h.address for h in inventory.hosts.values()} == set(known.keys()) == {"lab-ascend", "lab-cpu", "lab-cuda"}
    assert {h.role for h in inventory.hosts.values()} == {"ascend", "cpu", "cuda"}
    for host in inventory.hosts.values():
        assert host.transport == "ssh"
        assert host.identity_file == "/srv/alignflow/ssh/client_ed25519"  # compose mounts keys/ there
        pinned = known.lookup(str(host.address))
        assert pinned is not None
        own = paramiko.Ed25519Key.from_private_key_file(str(lab / "keys" / str(host.address) / "ssh_host_ed25519_key"))
        assert pinned["ssh-ed25519"] == own  # known_hosts pins each container's own host key
        authorized = (lab / "keys" / str(host.address) / "authorized_keys").read_text()
        assert authorized == (lab / "keys" / "client_ed25519.pub").read_text()
    # the sshd config the lab image installs is accepted by sshd (key paths pointed at the generated keys); sshd -t
    # needs the privilege-separation directory, which nothing may have created yet on this machine
    ensure_privsep_dir()
    conf = tmp_path / "sshd_config"
    conf.write_text((lab / "sshd_config").read_text().replace("/etc/alignflow-lab", str(lab / "keys" / "lab-cpu")))
    check = subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(conf)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_compose_mounts_what_the_lab_inventory_and_the_image_expect(config: dict[str, Any], repo_root: Path) -> None:
    worker = config["services"]["worker"]
    targets = mounts(worker)
    assert targets["/srv/alignflow/experiments"] == str(repo_root / "experiments")
    assert targets["/srv/alignflow/hosts.yaml"] == str(repo_root / "hosts.yaml")
    assert targets["/srv/alignflow/nightly.yaml"] == str(repo_root / "nightly.yaml")
    assert targets["/var/lib/alignflow"] == "alignflow-state"
    assert "/srv/alignflow/ssh" in targets
    # the reports service sees the same state volume, read-only
    assert mounts(config["services"]["reports"])["/srv/state"] == "alignflow-state"
    assert worker["command"] == ["alignflow", "serve", "--experiments", "experiments", "--hosts", "hosts.yaml",
                                 "--nightly", "nightly.yaml"]
    dockerfile = (repo_root / "docker" / "Dockerfile").read_text()
    assert "WORKDIR /srv/alignflow" in dockerfile
    assert "openssh-client rsync" in dockerfile
