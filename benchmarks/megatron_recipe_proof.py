"""The shipped recipes on real Megatron-LM + Transformer Engine, as rendered: prepare here, train on a GPU host.

    python benchmarks/megatron_recipe_proof.py prepare OUT [--steps 30] [--recipe NAME ...]
    python benchmarks/megatron_recipe_proof.py keys OUT --logs DIR                           # on the GPU host
    python benchmarks/megatron_recipe_proof.py device OUT --runs 2 [--recipe NAME ...]     # on the GPU host

`prepare` (on the controller, alignflow installed) writes for each recipe, from a copy of its experiment file with
`training.steps` set to `--steps`: the `gpu_train` script exactly as `alignflow render EXP gpu_train --script` prints
it (the declared Megatron fixes and their launcher included), with its placeholders filled (`out`, the converted
checkpoint, `python3`), and a case file naming the conversion spec, the model, the megatron-core release and the data
prefix the script reads. It also writes `keys.json`: the Megatron command lines for `alignflow.frameworks.
megatron_build --keys` (the real model's key set, `tests/data/keysets/`).

`device` (on the GPU host: Megatron-LM at the script's entry, Transformer Engine, alignflow's light dependencies)
makes each recipe's inputs the way a run would meet them — a random bf16 MindFormers checkpoint of the spec's source
shapes, converted by `alignflow.convert.convert_to_megatron` (the `convert_megatron` step's code) with the recipe's
flavour and release, and an indexed dataset of random token ids written by megatron-core's own
`IndexedDatasetBuilder` — then runs the rendered script `--runs` times and keeps each log (`OUT/<recipe>/runN.log`).
Nothing of the script is edited: what runs is what alignflow renders.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RECIPES = ("glm52_mini", "qwen35_dense", "qwen35_moe", "glm52_1b")
WORK = "/tmp/proof"  # where the device side keeps checkpoints and step directories


def _experiment_copy(name: str, steps: int, tmp: Path) -> Path:
    """The recipe's experiment file with `training.steps` (and `base_steps`) set, next to its template."""
    from ruamel.yaml import YAML

    src = REPO / "experiments" / f"{name}.yaml"
    yaml = YAML()
    doc = yaml.load(src.read_text())
    doc["training"]["steps"] = steps
    if doc["npu"].get("template"):
        doc["npu"]["template"] = str((src.parent / doc["npu"]["template"]).resolve())
    out = tmp / f"{name}.yaml"
    with out.open("w") as fh:
        yaml.dump(doc, fh)
    return out


def prepare(out: Path, steps: int, recipes: list[str]) -> int:
    import tempfile

    from alignflow.backends.commands import step_command
    from alignflow.config import load_experiment
    from alignflow.preflight.sides import _megatron_flags
    from tests.recipes.copies import example_inventory

    out.mkdir(parents=True, exist_ok=True)
    keys: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in recipes:
            path = _experiment_copy(name, steps, Path(tmp))
            exp = load_experiment(path, example_inventory(REPO))
            work = f"{WORK}/{name}"
            script = subprocess.run(
                [sys.executable, "-m", "alignflow", "render", str(path), "gpu_train", "--script",
                 "--hosts", str(REPO / "hosts.ssh.example.yaml"), "--set", f"out={work}/run",
                 "--set", f"in:megatron_ckpt={work}/megatron_ckpt", "--set", "python=python3"],
                capture_output=True, text=True, check=True, cwd=REPO).stdout
            (out / name).mkdir(exist_ok=True)
            (out / name / "gpu_train.sh").write_text(script)
            flags = list(_megatron_flags(exp, step_command(exp, "gpu_train", data_sha256="").template.argv))
            data = flags[flags.index("--data-path") + 1]
            case = {"name": name, "spec": exp.conversion.spec, "model": exp.model.model_dump(mode="json"),
                    "megatron_version": exp.gpu.megatron_version, "data_prefix": data, "steps": steps,
                    "entry": exp.gpu.entry, "fixes": list(exp.gpu.fixes)}
            (out / name / "case.json").write_text(json.dumps(case, indent=1))
            keys.setdefault(exp.gpu.megatron_version, []).append(
                {"name": name, "argv": flags, "checkpoint": None, "keys_out": f"KEYS/{name}.json",
                 "fixes": list(exp.gpu.fixes)})
    (out / "keys.json").write_text(json.dumps(keys, indent=1))
    print(f"prepared {', '.join(recipes)} in {out}")
    return 0


def _random_mindformers(case: dict[str, object], dst: Path) -> None:
    """A bf16 MindFormers checkpoint (tracker, iteration dir, one safetensors file) of the spec's source shapes."""
    import torch
    from safetensors.torch import save_file

    from alignflow.config.model import ModelConfig
    from alignflow.convert.plan import build_plan
    from alignflow.convert.registry import load_spec

    model = ModelConfig.model_validate(case["model"])
    plan = build_plan(load_spec(str(case["spec"])), model, flavor="te", megatron_version=str(case["megatron_version"]))
    g = torch.Generator().manual_seed(1234)
    tensors = {}
    for m in plan.mappings:
        for key, shape in zip(m.sources, m.source_shapes, strict=True):
            dtype = torch.float32 if m.dtype == "float32" else torch.bfloat16
            tensors[key] = (torch.randn(shape, generator=g) * 0.02).to(dtype)
    it = dst / "iteration_00000010"
    it.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(it / "checkpoint-model-0000000-0000001.safetensors"))
    (it / "common.json").write_text(json.dumps({"epoch_num": 1, "step_num": 10, "global_step": 10}))
    (dst / "latest_checkpointed_iteration.txt").write_text("10")


def _random_dataset(prefix: str, vocab: int, seq: int, steps: int) -> None:
    """Megatron's indexed dataset (`<prefix>.bin/.idx`) of random ids below vocab-1 (the last id is EOD), written
    by megatron-core's own builder; enough documents for `steps` samples of `seq` tokens."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    for _ in range(4 * steps + 8):
        doc = rng.integers(0, vocab - 1, size=seq, dtype=np.int32)
        builder.add_document(torch.from_numpy(np.append(doc, vocab - 1).astype(np.int32)), [seq + 1])
    builder.finalize(prefix + ".idx")


def device(out: Path, runs: int, recipes: list[str], outdir: Path) -> int:
    from alignflow.config.model import ModelConfig
    from alignflow.convert.engine import convert_to_megatron

    failed = 0
    for name in recipes:
        case = json.loads((out / name / "case.json").read_text())
        work = Path(f"{WORK}/{name}")
        tree = Path(f"/data/src/mlm-{case['megatron_version']}")  # the release's tree, where the entry expects it
        if tree.is_dir():
            link = Path(case["entry"]).parent
            subprocess.run(["ln", "-sfnT", str(tree), str(link)], check=True)
            sys.path.insert(0, str(tree))  # the dataset builder below is the release's own (H100 run: not on the path)
        log = (outdir / f"{name}.txt").open("a")
        t0 = time.time()
        model = ModelConfig.model_validate(case["model"])
        if not (work / "megatron_ckpt").exists():
            _random_mindformers(case, work / "bf16_ckpt")
            summary = convert_to_megatron(work / "bf16_ckpt", work / "megatron_ckpt", spec=case["spec"], model=model,
                                          flavor="te", megatron_version=case["megatron_version"])
            log.write(f"converted: {summary}\n")
        if not Path(case["data_prefix"] + ".idx").exists():
            _random_dataset(case["data_prefix"], model.vocab_size, model.seq_length, case["steps"])
        log.write(f"inputs ready in {time.time() - t0:.1f} s\n")
        for k in range(1, runs + 1):
            subprocess.run(["rm", "-rf", f"{work}/run"], check=False)
            t = time.time()
            with (outdir / f"{name}-run{k}.log").open("w") as fh:
                rc = subprocess.run(["bash", str(out / name / "gpu_train.sh")], stdout=fh, stderr=subprocess.STDOUT,
                                    env=os.environ, check=False).returncode
            log.write(f"run{k}: rc {rc} in {time.time() - t:.1f} s: {shlex.quote(str(out / name / 'gpu_train.sh'))}\n")
            log.flush()
            failed += rc != 0
            if rc != 0:
                break
    return 1 if failed else 0


def keys(out: Path, outdir: Path) -> int:
    """`megatron_build --device cuda` over `keys.json`, one interpreter per release (its tree on PYTHONPATH): each
    recipe's real model built with the installed TE, its key set written to `outdir/keys/<recipe>.json`."""
    rc = 0
    for series, cases in json.loads((out / "keys.json").read_text()).items():
        for case in cases:
            case["keys_out"] = str(outdir / "keys" / f"{case['name']}.json")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([f"/data/src/mlm-{series}", str(REPO),
                                                            os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-m", "alignflow.frameworks.megatron_build", "--device", "cuda"],
                              input=json.dumps(cases), capture_output=True, text=True, env=env, check=False)
        (outdir / f"keys-{series}.log").write_text(done.stdout + "\n" + done.stderr[-20000:])
        rc |= done.returncode
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("prepare", "device", "keys"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--recipe", action="append", choices=RECIPES)
    ap.add_argument("--logs", type=Path, default=Path(os.environ.get("OUT", "/tmp/proof-logs")))
    args = ap.parse_args()
    recipes = args.recipe or list(RECIPES)
    if args.what == "prepare":
        return prepare(args.out, args.steps, recipes)
    args.logs.mkdir(parents=True, exist_ok=True)
    if args.what == "keys":
        return keys(args.out, args.logs)
    return device(args.out, args.runs, recipes, args.logs)


if __name__ == "__main__":
    raise SystemExit(main())
