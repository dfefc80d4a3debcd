"""microscale.torch's layers under FSDP2 (torch.distributed.fsdp.fully_shard), on CPU tensors in
one process (gloo): training steps with an optimizer give the unsharded model's outputs and
gradients, bit for bit. FSDP2 writes each step's gathered weight into the same storage without
moving its version counter, so a weight cache keyed on them would serve the first step's weight
(it did: the layers now keep a quantization only when is_first_microbatch asks, as
TransformerEngine's do).

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python) and torch."""

import pytest
import torch
import torch.distributed as dist

import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
fully_shard = getattr(pytest.importorskip("torch.distributed.fsdp"), "fully_shard", None)
if fully_shard is None:
    pytest.skip("FSDP2 (fully_shard) came with torch 2.6", allow_module_level=True)


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0)
    yield
    dist.destroy_process_group()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(mst.Linear(64, 64), torch.nn.ReLU(), mst.Linear(64, 32))


@pytest.mark.parametrize("recipe", [MXFP8BlockScaling, NVFP4BlockScaling])
@pytest.mark.parametrize("microbatches", [1, 2])
def test_fully_sharded_training_equals_the_plain_model(process_group, recipe, microbatches):
    plain, sharded = make_model(), make_model()
    for layer in sharded:
        if isinstance(layer, mst.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    assert isinstance(sharded[0].weight, torch.distributed.tensor.DTensor)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, sharded)]
    g = torch.Generator().manual_seed(1)
    for step in range(4):  # the weights change every step
        xs = [torch.randn(32, 64, generator=g) for _ in range(microbatches)]
        results = []
        for model, optimizer in zip((plain, sharded), optimizers):
            torch.manual_seed(10 + step)  # the gradients' stochastic rounding (NVFP4)
            outputs = []
            for i, x in enumerate(xs):  # micro-batches: the weight quantized on the first, kept after
                with mst.autocast(recipe=recipe()):
                    y = model(x) if microbatches == 1 else model[2](model[1](model[0](
                        x, is_first_microbatch=i == 0)), is_first_microbatch=i == 0)
                y.square().mean().backward()
                outputs.append(y.detach())
            grad = model[0].weight.grad
            results.append(outputs + [grad.full_tensor() if hasattr(grad, "full_tensor") else grad])
            optimizer.step()
            optimizer.zero_grad()
        for a, b in zip(*results):
            assert torch.equal(a, b), step
