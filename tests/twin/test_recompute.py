"""Full recomputation in one pipeline stage of the PyTorch twin (`TwinGPTTorch.stage_forward`): the layers run again
in the backward pass and give the gradients of the plain run bit for bit; what they report to `moe_out` in the
recomputation comes after the forward's own entries, which `run_micro_batch` keeps apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from alignflow.config import load_experiment
from alignflow.twin.presets import twin_spec
from alignflow.twin.torch_model import TwinGPTTorch


def _stage(repo_root: Path, recompute: int) -> TwinGPTTorch:
    spec = twin_spec(load_experiment(repo_root / "experiments" / "demo.yaml").model)  # layer 1 is MoE
    torch.manual_seed(0)
    return TwinGPTTorch(dataclasses.replace(spec, recompute_num_layers=recompute), stage=0, stages=2)


def test_a_first_stage_recomputes_its_layers_with_the_plain_gradients(repo_root: Path) -> None:
    plain, recomputing = _stage(repo_root, 0), _stage(repo_root, 1)
    recomputing.load_state_dict(plain.state_dict())
    calls = {"plain": 0, "recomputing": 0}
    for name, model in (("plain", plain), ("recomputing", recomputing)):
        for layer in model.decoder.layers:
            layer.register_forward_pre_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
    tokens = torch.randint(0, plain.spec.vocab_size, (2, plain.spec.seq_length))
    grads, entries = {}, {}
    for name, model in (("plain", plain), ("recomputing", recomputing)):
        moe_out: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden = model.stage_forward(tokens, None, moe_out)
        forward_entries = len(moe_out)
        hidden.square().mean().backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        entries[name] = (forward_entries, len(moe_out))
    assert calls == {"plain": 2, "recomputing": 4}  # two layers per stage, each run again in the backward
    assert entries["plain"] == (1, 1)  # one MoE layer on this stage
    assert entries["recomputing"][0] == 1
    assert grads["plain"].keys() == grads["recomputing"].keys()
    for n, g in grads["plain"].items():
        assert torch.equal(g, grads["recomputing"][n]), n
