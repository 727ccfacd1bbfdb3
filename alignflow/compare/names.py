"""File names of the report's pictures, apart from `plots` so that readers of a written report (the flow's run
summary embeds the thumbnails) do not import matplotlib (~0.45 s of every `alignflow run`, cached or not)."""

from __future__ import annotations

import re

THUMBNAIL_METRICS = ("lm_loss", "grad_norm")


def _png(kind: str, metric: str) -> str:
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_.-]', '_', metric)}.png"


def png_name(metric: str) -> str:
    return _png("plot", metric)


def thumbnail_name(metric: str) -> str:
    return _png("thumb", metric)
