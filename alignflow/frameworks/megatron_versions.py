"""What a Megatron-LM command line must say for a given megatron-core version and GPU host.

Everything here was read off the Megatron-LM source of each supported tag (core_v0.16.1, core_v0.17.1,
core_v0.18.2, core_v0.19.0; https://github.com/NVIDIA/Megatron-LM) or seen running core_v0.19 on an H200 without
Transformer Engine or Apex:

- **NullTokenizer.** Up to 0.17 (`megatron/training/tokenizer/tokenizer.py::_NullTokenizer` in 0.16,
  `megatron/core/tokenizers/text/libraries/null_tokenizer.py` in 0.17) the tokenizer *appends* the
  end-of-document id: `vocab_size = --vocab-size + 1`, `eod = --vocab-size`. From 0.18 the same class takes
  `--vocab-size` as the whole vocabulary and puts EOD at `vocab_size - 1` unless `--null-tokenizer-eod-id` says
  otherwise (a flag 0.18 adds). alignflow's data ends documents with the vocabulary's last id, so a model of
  `V` ids is `--vocab-size V-1` up to 0.17 and `--vocab-size V --null-tokenizer-eod-id V-1` from 0.18: EOD is
  `V - 1` and the padded vocabulary `V` on every version (seen on 0.19: `--vocab-size 255` put EOD at 254).
- **Fused kernels.** With `--transformer-impl local`, each fusion that needs an extension is switched off unless
  the host has it: RoPE fusion needs Transformer Engine (`apply_rope_fusion is not available. Please install TE
  >= 1.4.`), the persistent layer norm Apex's FastLayerNorm and never RMSNorm (`persist_layer_norm not supported by
  torch LayerNorm`), gradient-accumulation fusion Apex's `fused_weight_gradient_mlp_cuda` (`ColumnParallelLinear
  was called with gradient_accumulation_fusion set to True but the custom CUDA extension ... is not found`), the
  masked-softmax fusion Apex's `scaled_masked_softmax_cuda`. The bias-dropout and bias-SwiGLU fusions are
  torch.jit code: off for alignment, unless `training.bias_swiglu_fusion` asks for the fused SwiGLU (a matrix
  variant's switch; the twin computes it as megatron's `SwiGLUFunction`).
- **Evaluation.** `eval_interval` defaults to None in 0.16-0.19 and `train_iters // eval_interval` runs even with
  `--eval-iters 0` (`TypeError: unsupported operand type(s) for //: 'int' and 'NoneType'`): `--eval-interval`
  is always given.
- **Determinism.** `--deterministic-mode` asserts `NCCL_ALGO` is set to Tree, Ring, CollnetDirect, CollnetChain
  or ^NVLS up to 0.18 (`arguments.py::validate_args`); 0.19 (`training/determinism.py`) accepts it unset, refuses
  Tree, and refuses `NVTE_ALLOW_NONDETERMINISTIC_ALGO` other than 0 and `CUBLAS_WORKSPACE_CONFIG` other than
  `:4096:8` / `:16:8`. `NCCL_ALGO=Ring` satisfies every version.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from alignflow.errors import ConfigError


class MegatronVersionError(ConfigError, ValueError):
    """A megatron-core version that is not `X.Y[.Z][suffix]`; a ConfigError and, for older callers, a ValueError."""


# An optional `v`, `core_v` or `core_r` (git tags / release branches), X.Y, optional .Z, optional suffix (rc1, +sha).
_VERSION = re.compile(r"^(?:core_[rv]|v)?(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?\w+)*$")


def parse_version(version: str) -> tuple[int, int]:
    """`0.16`, `0.16.1`, `0.17.0rc1`, `v0.16`, `core_r0.17.0` -> (major, minor); MegatronVersionError otherwise."""
    m = _VERSION.match(version.strip())
    if m is None:
        raise MegatronVersionError(f"megatron-core version {version!r} is not X.Y or X.Y.Z (optionally prefixed "
                                   "by v, core_v or core_r, suffixed like rc1)")
    return int(m.group(1)), int(m.group(2))


TE = "transformer_engine"
APEX = "apex"

# The megatron-core versions alignflow accepts: each has a flag table (`megatron_flags/`) generated from its tag and
# the PyPI releases whose `megatron/core` the CI checks construct configs, specs and models with
# (`alignflow.frameworks.megatron_build`; installed side by side by `python -m alignflow.frameworks.megatron_installs`).
# Each release listed first is byte for byte the tag's `megatron/core` (package_info aside): 0.19.0 is the tag
# core_v0.19.0, which calls itself 0.19.1; 0.19.2 is a later patch release of the same series, checked too.
CHECKED_RELEASES: dict[str, tuple[str, ...]] = {
    "0.16": ("0.16.1",),
    "0.17": ("0.17.1",),
    "0.18": ("0.18.2",),
    "0.19": ("0.19.0", "0.19.2"),
}
SUPPORTED = tuple(CHECKED_RELEASES)
# Versions refused by name, with why: a version nobody checked must not pass as "not checked".
REFUSED: dict[str, str] = {
    "0.20": "Megatron-LM main (megatron-core 0.20.0) is not a release: its code moves daily, no PyPI wheel holds it, "
            "and as fetched (2026-08-22) it cannot build any MTP model without Transformer Engine (`TypeError: "
            "isinstance() arg 2 must be a type` when instantiating MultiTokenPredictionLayer: the MagicMock "
            "stand-ins of megatron/core/extensions/transformer_engine.py for TE's classes); use core_v0.19.0",
}
# A TE release the TE-side checks pretend is installed (`megatron_build`: megatron-core asks for its version).
TE_STAND_IN_VERSION = "2.9.0"


def accepted_problem(version: str) -> str | None:
    """Why megatron-core `version` is not one alignflow accepts (None: it is)."""
    try:
        major, minor = parse_version(version)
    except MegatronVersionError as exc:
        return str(exc)
    series = f"{major}.{minor}"
    if series in SUPPORTED:
        return None
    why = REFUSED.get(series, "alignflow has no flag table and no checked configuration, spec or model code for it")
    return (f"megatron-core {version} is not accepted: {why}. Accepted: {', '.join(SUPPORTED)} (a new release "
            "needs its flag table and its checks: docs/recipes/README.md#a-new-megatron-release)")


@dataclass(frozen=True, slots=True)
class NullTokenizer:
    """How megatron-core's NullTokenizer reads `--vocab-size` (and `--null-tokenizer-eod-id`)."""

    appends_eod: bool  # vocab = --vocab-size + 1, eod = --vocab-size (up to 0.17)
    has_eod_flag: bool  # --null-tokenizer-eod-id exists (0.18+)

    def vocab_and_eod(self, vocab_size_flag: int, eod_flag: int | None = None) -> tuple[int, int]:
        """(tokenizer vocabulary before padding, end-of-document id) for these flag values."""
        if self.appends_eod:
            return vocab_size_flag + 1, vocab_size_flag
        return vocab_size_flag, eod_flag if eod_flag is not None else vocab_size_flag - 1

    def flags(self, vocab: int) -> list[str]:
        """Flags for a vocabulary of `vocab` ids whose last id ends a document."""
        if self.appends_eod:
            return ["--vocab-size", str(vocab - 1)]
        return ["--vocab-size", str(vocab), "--null-tokenizer-eod-id", str(vocab - 1)]


def null_tokenizer(version: str) -> NullTokenizer:
    newer = parse_version(version) >= (0, 18)
    return NullTokenizer(appends_eod=not newer, has_eod_flag=newer)


def kernel_flags(*, transformer_impl: str, normalization: str, rope: bool,
                 extensions: Collection[str] | None, dsa: bool = False) -> list[str]:
    """The `--no-*-fusion` switches for a host that has `extensions` (None: not known, assume none). DSA refuses
    RoPE fusion on every implementation (`megatron_refusals`, dsa-rope-fusion)."""
    if transformer_impl != "local":
        return ["--no-rope-fusion"] if dsa else []
    has = set(extensions or ())
    f = []
    if APEX not in has or normalization == "RMSNorm":
        f.append("--no-persist-layer-norm")
    if APEX not in has:
        f += ["--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion"]
    f += ["--no-bias-dropout-fusion", "--no-bias-swiglu-fusion"]
    if (rope and TE not in has) or dsa:
        f.append("--no-rope-fusion")
    return f


def determinism_env() -> dict[str, str]:
    """Environment `--deterministic-mode` needs on every supported version."""
    return {"NCCL_ALGO": "Ring", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def determinism_env_problems(env: Mapping[str, str], version: str) -> list[str]:
    """What `--deterministic-mode` of megatron-core `version` refuses in `env`."""
    v = parse_version(version)
    problems = []
    algo = env.get("NCCL_ALGO")
    if v < (0, 19):
        if algo not in ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"):
            problems.append(f"NCCL_ALGO={algo!r}: megatron-core {version} --deterministic-mode asserts it is one of "
                            "Tree, Ring, CollnetDirect, CollnetChain, ^NVLS")
        return problems
    if algo is not None:
        tokens = [t.strip() for t in algo.split(",") if t.strip()]
        if not tokens or any(t not in ("Ring", "CollnetDirect", "CollnetChain", "^NVLS") for t in tokens):
            problems.append(f"NCCL_ALGO={algo!r}: megatron-core {version} --deterministic-mode accepts Ring, "
                            "CollnetDirect, CollnetChain, ^NVLS (not Tree)")
    for name, accepted in (("NVTE_ALLOW_NONDETERMINISTIC_ALGO", ("0",)),
                           ("CUBLAS_WORKSPACE_CONFIG", (":4096:8", ":16:8"))):
        value = env.get(name)
        if value is not None and value not in accepted:
            problems.append(f"{name}={value!r}: megatron-core {version} --deterministic-mode accepts "
                            f"{' or '.join(accepted)}")
    return problems
