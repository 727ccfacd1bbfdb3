"""The MindSpore side: MindFormers names and layouts, PyNative checkpoints, and agreement with the PyTorch side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# Real MindSpore models in-process: importing MindSpore alone costs about a second, so not in the unit tier.
pytestmark = pytest.mark.slow
ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

from alignflow.errors import ConfigError  # noqa: E402
from alignflow.twin import ms_checkpoint as ckpt  # noqa: E402
from alignflow.twin.ms_model import TwinGPTMindSpore  # noqa: E402
from alignflow.twin.presets import preset, twin_spec  # noqa: E402
from alignflow.twin.torch_model import TwinGPTTorch  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)


def _net(name: str, seed: int = 1) -> Any:
    ms.set_seed(seed)
    return TwinGPTMindSpore(twin_spec(preset(name)))


def _params(net: Any) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy() for p in net.get_parameters()}


def test_parameter_names_and_layouts_are_mindformers_pynative_s() -> None:
    shapes = {k: v.shape for k, v in _params(_net("twin-moe")).items()}
    assert shapes["embedding.word_embeddings.weight"] == (256, 128)
    assert shapes["decoder.layers.0.self_attention.linear_qkv.weight"] == (256, 128)
    assert shapes["decoder.layers.0.mlp.linear_fc1.weight"] == (512, 128)
    assert shapes["decoder.layers.1.mlp.experts.weight1"] == (4, 128, 128)
    assert shapes["decoder.layers.1.mlp.experts.weight2"] == (4, 64, 128)
    assert shapes["decoder.layers.1.mlp.shared_experts.linear_fc1.weight"] == (128, 128)
    assert shapes["decoder.layers.1.mlp.shared_experts.shared_experts_gate.weight"] == (1, 128)
    assert shapes["decoder.layers.3.mlp.tokens_per_expert"] == (4,)
    assert shapes["mtp.layers.0.eh_proj.weight"] == (128, 256)
    assert shapes["mtp.layers.0.transformer_layer.mlp.router.weight"] == (4, 128)
    assert "decoder.layers.1.mlp.expert_bias" not in shapes
    assert not any(k.startswith("model.") for k in shapes)
    assert len(shapes) == 57
    bias = _net("twin-moe-bias").get_parameters()
    biases = {p.name: p for p in bias if p.name.endswith("expert_bias")}
    assert set(biases) == {f"decoder.layers.{i}.mlp.expert_bias" for i in (1, 2, 3)} | {
        "mtp.layers.0.transformer_layer.mlp.expert_bias"}
    assert all(p.dtype == ms.float32 and not p.requires_grad for p in biases.values())


def to_megatron(params: dict[str, np.ndarray]) -> dict[str, Any]:
    """Test oracle of the naming contract (docs/architecture.md#the-reference-twin, issue 5): MindFormers ->
    megatron-core local names."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name.endswith("tokens_per_expert"):
            continue
        if name.endswith("linear_fc1.weight"):  # dense and shared expert: [g0,u0,g1,u1,...] -> [gate; up]
            value = np.concatenate([value[0::2], value[1::2]])
        if name.endswith(("experts.weight1", "experts.weight2")):
            fc = "linear_fc1" if name.endswith("weight1") else "linear_fc2"
            for e in range(value.shape[0]):
                key = name.replace(name.rsplit(".", 1)[1], f"local_experts.{e}.{fc}.weight")
                out[key] = torch.from_numpy(np.ascontiguousarray(value[e].T))
            continue
        name = name.replace("shared_experts_gate.weight", "gate_weight").replace("mlp.expert_bias",
                                                                                   "mlp.router.expert_bias")
        out[name] = torch.from_numpy(np.ascontiguousarray(value))
    return out


@pytest.mark.slow  # a MindSpore and a torch forward/backward of each preset (tens of seconds on 2 cores)
@pytest.mark.parametrize("name", ["twin-moe", "twin-moe-bias", "twin-dense", "qwen3"])
def test_both_sides_compute_the_same_losses_and_gradients(name: str) -> None:
    net = _net(name)
    twin = TwinGPTTorch(twin_spec(preset(name)))
    twin.load_state_dict(to_megatron(_params(net)), strict=True)
    rows = np.random.RandomState(0).randint(0, 256, size=(4, 33))
    grad_fn = ms.value_and_grad(net, None, net.trainable_params(), has_aux=True)
    (_, lm_sum, mtp, aux, counts), grads = grad_fn(ms.Tensor(rows[:, :-1].astype(np.int32)),
                                                    ms.Tensor(rows[:, 1:].astype(np.int32)), ms.Tensor(1.0))
    out = twin(torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:]))
    out.objective.backward()
    assert float(lm_sum.asnumpy()) == pytest.approx(out.lm_sum.item(), rel=2e-6)
    np.testing.assert_allclose(mtp.asnumpy(), [m.item() for m in out.mtp_means], rtol=2e-6)
    np.testing.assert_allclose(aux.asnumpy(), [a.item() for a in out.aux_raw], rtol=2e-6)
    np.testing.assert_array_equal(counts.asnumpy(), np.stack([c.numpy() for c in out.counts]) if out.counts
                                  else counts.asnumpy())
    ms_norm = np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
    pt_norm = np.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in twin.parameters() if p.grad is not None))
    assert ms_norm == pytest.approx(pt_norm, rel=1e-5)


def test_checkpoint_layout_common_json_and_tracker(tmp_path: Path) -> None:
    net = _net("twin-moe")
    model = [{"name": p.name, "data": p.value()} for p in net.get_parameters()]
    saved: list[Path] = []
    for step in (2, 4, 6):
        ckpt.save(tmp_path, step, prefix="checkpoint", model=model, optimizer=None,
                  common=ckpt.common_info(step_num=6, global_step=step, global_batch_size=4,
                                          consumed_samples=4 * step), save_max=2, saved_by_this_run=saved)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert [p.name for p in ckpt.latest_iteration_dirs(tmp_path)] == ["iteration_00000004", "iteration_00000006"]
    files = sorted(p.name for p in (tmp_path / "iteration_00000006").iterdir())
    assert files == ["checkpoint-model-0000000-0000001.safetensors", "common.json"]
    common = json.loads((tmp_path / "iteration_00000006" / "common.json").read_text())
    assert list(common) == ["epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size",
                            "consumed_samples", "ckpt_status"]
    loaded = ckpt.load(tmp_path, need_optimizer=False, where="t")
    assert loaded.directory.name == "iteration_00000006"
    assert set(loaded.tensors) == {p.name for p in net.get_parameters()}
    assert ckpt.load(tmp_path / "iteration_00000004", need_optimizer=False, where="t").common["global_step"] == 4


@pytest.mark.parametrize(("break_it", "message"), [
    (lambda d: (d / "iteration_00000002" / "common.json").unlink(), "Can not find 'common.json'"),
    (lambda d: (d / "iteration_00000002" / "common.json").write_text('{"epoch_num": 1, "data": 2}'),
     "CommonInfo rejects"),
    (lambda d: (d / "latest_checkpointed_iteration.txt").write_text("9"), "does not exist"),
    (lambda d: d.rename(d.with_name("gone")), "does not exist"),
])
def test_broken_checkpoints_are_errors(tmp_path: Path, break_it: Any, message: str) -> None:
    root = tmp_path / "ckpt"
    net = _net("twin-dense")
    ckpt.save(root, 2, prefix="checkpoint", model=[{"name": p.name, "data": p.value()} for p in net.get_parameters()],
              optimizer=None, common=ckpt.common_info(step_num=2, global_step=2, global_batch_size=4,
                                                      consumed_samples=8), save_max=5, saved_by_this_run=[])
    break_it(root)
    with pytest.raises(ConfigError, match=message):
        ckpt.load(root, need_optimizer=False, where="t")


def test_weights_only_directories_refuse_a_full_resume(tmp_path: Path) -> None:
    net = _net("twin-dense")
    ckpt.save(tmp_path, 2, prefix=None, model=[{"name": p.name, "data": p.value()} for p in net.get_parameters()],
              optimizer=None, common=ckpt.common_info(step_num=2, global_step=2, global_batch_size=4,
                                                      consumed_samples=8), save_max=5, saved_by_this_run=[])
    assert (tmp_path / "iteration_00000002" / "model-0000000-0000001.safetensors").is_file()
    with pytest.raises(ConfigError, match="no_load_optim is False but no optimizer checkpoint"):
        ckpt.load(tmp_path, need_optimizer=True, where="t")
