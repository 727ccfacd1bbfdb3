"""Declared fixes of Megatron-LM: alignflow's own runtime patches that a `megatron` side names in `<side>.fixes`.

Real users train a Megatron they changed (the seeds' authors did, docs/seeds.md; MindSpeed patches Megatron at import
through its adaptor). A fix here is a Python file of alignflow's own words, run by the step's launcher
(`megatron_launch.py`, written into the step directory) before the entry, `pretrain_gpt.py`, starts. The run records
each fix with its sha256 (the step's code version, hence its cache key), `alignflow render` prints the launcher,
preflight lists the fixes and models the builder they change (`megatron_build`, `megatron_refusals`), and the
report names them. A fix is also a path to a Python file of the user's (relative to the experiment file), recorded
the same way.

Shipped: `mtp-experimental-attention` (megatron-core 0.19): the ModelBuilder's MTP block takes the experimental
attention variant's last layer spec, as gpt_builders.py does, so MTP with DSA or GatedDeltaNet builds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from alignflow.errors import ConfigError

LAUNCHER = "megatron_launch.py"


@dataclass(frozen=True, slots=True)
class MegatronFix:
    """One declared fix: its name, the source text the launcher runs and that text's sha256."""

    name: str
    source: str
    releases: tuple[str, ...] | None  # megatron-core series it is written for (None: a user's file, any)
    what: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def file_name(self) -> str:
        return f"megatron_fix_{self.name.replace('-', '_')}.py"

    def label(self) -> str:
        return f"{self.name}@{self.sha256[:12]}"


_SHIPPED: dict[str, tuple[str, tuple[str, ...], str]] = {
    "mtp-experimental-attention": (
        "mtp_experimental_attention.py", ("0.19",),
        "the ModelBuilder's MTP block takes the experimental attention variant's layer spec (as gpt_builders.py "
        "does), so MTP with DSA or GatedDeltaNet builds"),
}
SHIPPED_FIXES: tuple[str, ...] = tuple(_SHIPPED)


def resolve_fix(name: str, *, base: Path | None = None) -> MegatronFix:
    """The fix `name`: one alignflow ships, or a `.py` file (relative to `base`, the experiment's directory)."""
    if name in _SHIPPED:
        file, releases, what = _SHIPPED[name]
        source = resources.files(__package__).joinpath(file).read_text(encoding="utf-8")
        return MegatronFix(name, source, releases, what)
    if name.endswith(".py"):
        path = Path(name) if base is None or Path(name).is_absolute() else base / name
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"fix {name}: cannot read {path}: {exc.strerror or exc}") from exc
        return MegatronFix(Path(name).stem, source, None, f"the user's file {name}")
    raise ConfigError(f"fix {name!r}: not a fix alignflow ships ({', '.join(SHIPPED_FIXES)}) nor a .py file")


def launcher(fixes: tuple[MegatronFix, ...], entry: str, *, adaptor: str | None = None) -> str:
    """The step's launcher: `adaptor` imported first (MindSpeed on an Ascend host), each fix run in order (before
    Megatron builds anything), then `entry` as `__main__` with its own argv."""
    runs = "".join(f"runpy.run_path(os.path.join(HERE, {f.file_name!r}), run_name={f.name!r})  # sha256 {f.sha256}\n"
                   for f in fixes)
    return (
        "# rendered by alignflow: the declared Megatron fixes run before the entry "
        "(alignflow.frameworks.megatron_fixes)\n"
        "import importlib\nimport os\nimport runpy\nimport sys\n\n"
        "HERE = os.path.dirname(os.path.abspath(__file__))\n"
        f"ENTRY = {entry!r}\n"
        "sys.argv[0] = ENTRY\n"
        "sys.path.insert(0, os.path.dirname(ENTRY))\n"
        + (f"importlib.import_module({adaptor!r})\n" if adaptor else "")
        + f"{runs}"
        "runpy.run_path(ENTRY, run_name='__main__')\n"
    )
