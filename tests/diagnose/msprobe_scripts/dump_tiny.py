"""Dump one training step of a tiny network with real msprobe 26.2 (L0, `task` from argv) on the CPU.

    python dump_tiny.py pytorch|mindspore tensor|statistics DUMP_PATH [perturb]

Both frameworks build the same network from the same seeded weights: `block.<inner>` (a linear, called
`transformer_layer` on the MindSpore side and `mtp_model_layer` on the PyTorch side, as the MTP inner layer of
MindFormers and megatron-core 0.17) and `block.proj`. `perturb` changes `block.proj.weight` on this side.
"""

import json
import sys

import numpy as np

framework, task, dump_path = sys.argv[1:4]
perturb = len(sys.argv) > 4
rng = np.random.default_rng(0)
W1 = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
W2 = rng.standard_normal((4, 8)).astype(np.float32) * 0.3
X = rng.standard_normal((2, 8)).astype(np.float32)
if perturb:
    W2 = W2 * 1.5
config = {"task": task, "dump_path": dump_path, "rank": [], "step": [0], "level": "L0",
          task: {"scope": [], "list": [], "data_mode": ["all"]}}
with open(f"{dump_path}.config.json", "w") as f:
    json.dump(config, f)

if framework == "pytorch":
    import torch
    from msprobe.pytorch import PrecisionDebugger
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mtp_model_layer = nn.Linear(8, 8, bias=False)
            self.proj = nn.Linear(8, 4, bias=False)

        def forward(self, x):
            return self.proj(torch.nn.functional.silu(self.mtp_model_layer(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x).sum()

    net = Net()
    with torch.no_grad():
        net.block.mtp_model_layer.weight.copy_(torch.from_numpy(W1))
        net.block.proj.weight.copy_(torch.from_numpy(W2))
    debugger = PrecisionDebugger(config_path=f"{dump_path}.config.json")
    debugger.start(model=net)
    net(torch.from_numpy(X)).backward()
    debugger.stop()
    debugger.step()
else:
    import mindspore as ms
    from mindspore import mint, nn, ops

    # msprobe's MindSpore statistics call mint.norm, whose LinalgVectorNorm kernel MindSpore 2.10 has no CPU
    # build of ("The kernel LinalgVectorNorm unregistered"); the same L2 norm from CPU kernels stands in for it.
    mint.norm = lambda x, *a, **k: ops.sqrt((x.astype(ms.float32) ** 2).sum())
    from msprobe.mindspore import PrecisionDebugger

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.transformer_layer = nn.Dense(8, 8, has_bias=False)
            self.proj = nn.Dense(8, 4, has_bias=False)

        def construct(self, x):
            return self.proj(ops.silu(self.transformer_layer(x)))

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()

        def construct(self, x):
            return self.block(x).sum()

    net = Net()
    net.block.transformer_layer.weight.set_data(ms.Tensor(W1))
    net.block.proj.weight.set_data(ms.Tensor(W2))
    debugger = PrecisionDebugger(config_path=f"{dump_path}.config.json")
    grad_fn = ms.value_and_grad(net, None, net.trainable_params())
    debugger.start(model=net)
    grad_fn(ms.Tensor(X))
    debugger.stop()
    debugger.step()
