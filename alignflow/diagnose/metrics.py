"""Tensor comparison in msprobe's conventions: cosine similarity, max absolute error, relative L2 error.

msprobe's real-data compare (`msprobe/core/compare/multiprocessing_compute.py:check_accuracy`, 26.2) marks a
tensor pair "No" when `cosine < 0.99 and max_abs_err > 0.001`, or `cosine < 0.9`, or `max_abs_err > 1`; its
documented warning is an output whose norm relative error is at least 10x its input's (the module amplifies an
error instead of passing one on). Two fp32 twins agree far better than that, and a tiny tensor (a first AdamW
update of 1e-4) differs by less than 0.001 however wrong it is, so `diverged` also counts a relative L2 error
above `rel_floor` — a floor above the twins' own fp32 kernel noise (MindSpore vs PyTorch CPU kernels) — when the
inputs do not explain it (`amplification`x the input's error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from alignflow.pipeline import side

Status = Literal["match", "warning", "diverged", "shape", "absent"]
TINY = 1e-30

# msprobe 26.2 `CompareConst`: COS_THRESHOLD, MAX_ABS_ERR_THRESHOLD, COS_MAX_THRESHOLD, MAX_ABS_ERR_MAX_THRESHOLD
MSPROBE_COSINE = 0.99
MSPROBE_MAX_ABS = 0.001
MSPROBE_COSINE_MIN = 0.9
MSPROBE_MAX_ABS_MAX = 1.0
MSPROBE_AMPLIFICATION = 10.0


@dataclass(frozen=True, slots=True)
class Tolerance:
    """When two tensors count as the same (see the module docstring)."""

    cosine: float = MSPROBE_COSINE
    max_abs: float = MSPROBE_MAX_ABS
    rel_floor: float = 1e-4
    amplification: float = MSPROBE_AMPLIFICATION
    # AdamW's first update is ~lr * sign(g): where |g| is at the fp32 noise of the two backward passes the sign
    # can differ, so the clean twin's updates agree to ~3e-4 relative, not 1e-6 (one eps off: 5e-2)
    update_rel_floor: float = 1e-3

    def to_json(self) -> dict[str, float]:
        return {"cosine": self.cosine, "max_abs": self.max_abs, "rel_floor": self.rel_floor,
                "amplification": self.amplification, "update_rel_floor": self.update_rel_floor}


@dataclass(frozen=True, slots=True)
class TensorDiff:
    """One tensor pair (NPU side vs GPU side, the GPU side the reference)."""

    status: Status
    cosine: float | None = None
    max_abs: float | None = None
    rel_l2: float | None = None
    msprobe: str = ""  # msprobe's accuracy check: Yes / No
    npu_shape: tuple[int, ...] | None = None
    gpu_shape: tuple[int, ...] | None = None
    note: str = ""

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    @property
    def compared(self) -> bool:
        return self.status in ("match", "warning", "diverged")

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "cosine": _finite(self.cosine), "max_abs": _finite(self.max_abs),
                "rel_l2": _finite(self.rel_l2), "msprobe": self.msprobe,
                "npu_shape": list(self.npu_shape) if self.npu_shape is not None else None,
                "gpu_shape": list(self.gpu_shape) if self.gpu_shape is not None else None, "note": self.note}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def msprobe_accuracy(cosine: float, max_abs: float) -> str:
    """msprobe's `check_accuracy` verdict for a real-data pair."""
    if (cosine < MSPROBE_COSINE and max_abs > MSPROBE_MAX_ABS) or cosine < MSPROBE_COSINE_MIN \
            or max_abs > MSPROBE_MAX_ABS_MAX:
        return "No"
    return "Yes"


def cosine(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """Cosine similarity; two all-zero tensors are the same (1.0), one all-zero tensor is not (0.0)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def compare_tensors(npu: npt.NDArray[Any] | None, gpu: npt.NDArray[Any] | None, tol: Tolerance, *,
                    input_rel: float | None = None, rel_floor: float | None = None) -> TensorDiff:
    """Compare two tensors elementwise (flattened: the sides may lay out tokens as [B*S, H] or [B, S, H])."""
    if npu is None or gpu is None:
        only = side("gpu").label if npu is None and gpu is not None else side("npu").label \
            if gpu is None and npu is not None else "no"
        return TensorDiff("absent", note=f"on the {only} side only")
    if npu.size != gpu.size:
        return TensorDiff("shape", npu_shape=tuple(npu.shape), gpu_shape=tuple(gpu.shape),
                          note=f"{npu.size} vs {gpu.size} elements")
    a = np.asarray(npu, dtype=np.float64).reshape(-1)
    b = np.asarray(gpu, dtype=np.float64).reshape(-1)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        same = bool(np.array_equal(a, b, equal_nan=True))
        return TensorDiff("match" if same else "diverged", math.nan, math.nan, math.nan, "No",
                          tuple(npu.shape), tuple(gpu.shape), "non-finite values" + ("" if same else " on one side"))
    diff = a - b
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    rel = float(np.linalg.norm(diff) / (np.linalg.norm(b) + TINY)) if diff.size else 0.0
    if diff.size and not np.any(b) and np.any(a):
        rel = math.inf
    cos = cosine(a, b)
    check = msprobe_accuracy(cos, max_abs)
    note = ""
    if check == "No":
        status: Status = "diverged"
    elif rel > (tol.rel_floor if rel_floor is None else rel_floor) and (
            input_rel is None or rel >= tol.amplification * max(input_rel, TINY)):
        status = "diverged"
        if input_rel is not None:
            note = f"relative error {rel:.2e} >= {tol.amplification:g}x the input's {input_rel:.2e}"
    elif cos < tol.cosine or max_abs >= tol.max_abs:
        status = "warning"
    else:
        status = "match"
    return TensorDiff(status, cos, max_abs, rel, check, tuple(npu.shape), tuple(gpu.shape), note)


def compare_statistics(npu: dict[str, float] | None, gpu: dict[str, float] | None, tol: Tolerance) -> TensorDiff:
    """A statistics-only pair (msprobe `task: statistics`): the relative error of the L2 norms, max and min."""
    if npu is None or gpu is None:
        return TensorDiff("absent", note="statistics on one side only")
    rels = []
    for key in ("Norm", "Max", "Min"):
        x, y = npu.get(key), gpu.get(key)
        if isinstance(x, int | float) and isinstance(y, int | float):
            rels.append(abs(float(x) - float(y)) / (abs(float(y)) + TINY))
    if not rels:
        return TensorDiff("absent", note="no comparable statistics")
    rel = max(rels)
    return TensorDiff("diverged" if rel > tol.rel_floor else "match", rel_l2=rel, note="statistics (norm/max/min)")


def worst(diffs: list[TensorDiff]) -> TensorDiff | None:
    """The pair that matters most in a row: a divergence, else the largest relative error."""
    compared = [d for d in diffs if d.compared]
    if not compared:
        return diffs[0] if diffs else None
    rank = {"diverged": 2, "warning": 1, "match": 0}
    return max(compared, key=lambda d: (rank[d.status], d.rel_l2 if d.rel_l2 is not None else 0.0))
