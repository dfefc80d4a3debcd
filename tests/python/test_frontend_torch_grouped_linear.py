"""microscale.torch.GroupedLinear (TransformerEngine's mixture-of-experts Linear): each expert is
the quantized Linear on its own rows, bit for bit against the same composition written out with
microscale.torch.Linear, forward and backward, for NVFP4 (stochastic rounding included) and MXFP8;
empty experts; TransformerEngine's parameter names, return_bias and m_splits forms; errors; traced
whole by torch.compile.

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python) and torch."""

import pytest
import torch

import microscale as ms
import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling

RECIPES = {"nvfp4": NVFP4BlockScaling, "mxfp8": MXFP8BlockScaling,
           "mxfp8_2d": lambda: MXFP8BlockScaling(enable_2d_quantization=True)}  # 32x32 weight tiles


def experts_as_linears(grouped):
    """The same experts as separate microscale.torch.Linear layers over copies of the parameters."""
    linears = []
    for weight, bias in zip(grouped.weights, grouped.biases):
        linear = mst.Linear(grouped.in_features, grouped.out_features, bias=bias is not None,
                            params_dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight)
            if bias is not None:
                linear.bias.copy_(bias)
        linears.append(linear)
    return linears


def step(forward, parameters, x, dy, recipe, seed=4):
    """y, dx and the parameters' gradients of one step of forward(x) under recipe."""
    x = x.detach().clone().requires_grad_()
    for p in parameters:
        p.grad = None
    with mst.autocast(recipe=recipe):
        y = forward(x)
    torch.manual_seed(seed)  # the gradients' stochastic rounding (NVFP4)
    y.backward(dy)
    return [y.detach(), x.grad] + [p.grad for p in parameters]


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
@pytest.mark.parametrize("splits", [[32, 64, 32], [64, 0, 64]])
def test_grouped_linear_is_one_quantized_linear_per_expert(recipe_name, splits):
    recipe = RECIPES[recipe_name]()
    torch.manual_seed(0)
    grouped = mst.GroupedLinear(3, 64, 96, params_dtype=torch.bfloat16)
    linears = experts_as_linears(grouped)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, 64, generator=g).to(torch.bfloat16)  # 128 rows after flattening
    dy = torch.randn(2, 64, 96, generator=g).to(torch.bfloat16)

    def composed(t):
        rows = torch.split(t.reshape(-1, 64), splits)
        return torch.cat([linear(r) if len(r) else torch.nn.functional.linear(r, linear.weight, linear.bias)
                          for linear, r in zip(linears, rows)]).reshape(2, 64, 96)

    got = step(lambda t: grouped(t, splits), list(grouped.parameters()), x, dy, recipe)
    want = step(composed, [p for linear in linears for p in linear.parameters()], x, dy, recipe)
    assert len(got) == len(want) == 2 + 6
    for n, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), n
    if 0 in splits:  # the empty expert: zero gradients
        assert not got[2 + 2].any() and not got[2 + 3].any()
    assert grouped.weight_quantizations == sum(1 for m in splits if m)


def test_grouped_linear_names_splits_and_return_bias():
    torch.manual_seed(2)
    grouped = mst.GroupedLinear(2, 32, 64, return_bias=True)
    assert set(grouped.state_dict()) == {"weight0", "weight1", "bias0", "bias1"}  # TransformerEngine's
    state = grouped.state_dict()
    state["_extra_state"] = torch.empty(0)  # a TransformerEngine module's FP8 metadata: dropped
    grouped.load_state_dict(state)
    x = torch.randn(64, 32)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        y, biases = grouped(x, [32, 32])
        y_tensor_splits, _ = grouped(x, torch.tensor([32, 32]))
    assert torch.equal(y, y_tensor_splits) and len(biases) == 2 and torch.equal(biases[1], grouped.bias1)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        with_bias = mst.GroupedLinear(2, 32, 64)
        with_bias.load_state_dict(grouped.state_dict())
        assert torch.equal(with_bias(x, [32, 32]), y + torch.cat([grouped.bias0.expand(32, 64),
                                                                 grouped.bias1.expand(32, 64)]))
    no_bias = mst.GroupedLinear(2, 32, 64, bias=False, return_bias=True)
    assert set(no_bias.state_dict()) == {"weight0", "weight1"}
    _, empty = no_bias(x, [32, 32])
    assert [b.numel() for b in empty] == [0, 0]
    outside = grouped(x, [16, 48])[0]  # outside a scope: high precision, any split
    assert torch.allclose(outside[16:], x[16:] @ grouped.weight1.t(), atol=1e-5)


def test_grouped_linear_errors():
    grouped = mst.GroupedLinear(2, 32, 64)
    x = torch.randn(64, 32)
    for splits in ([32], [32, 16], [96, -32]):
        with pytest.raises(ms.Error, match="m_splits"):
            grouped(x, splits)
    with pytest.raises(ms.Error, match="features"):
        grouped(torch.randn(64, 48), [32, 32])
    with mst.autocast(recipe=NVFP4BlockScaling()), pytest.raises(ms.Error):
        grouped(x, [24, 40])  # NVFP4 blocks rows by 16
    with pytest.raises(ms.Error, match="num_gemms"):
        mst.GroupedLinear(0, 32, 64)


def test_grouped_linear_fuse_wgrad_accumulation():
    torch.manual_seed(3)
    grouped = mst.GroupedLinear(2, 32, 64, fuse_wgrad_accumulation=True)
    linears = experts_as_linears(grouped)
    for linear in linears:
        linear.fuse_wgrad_accumulation = True
    for w in grouped.weights + [linear.weight for linear in linears]:
        w.main_grad = torch.zeros(64, 32)
    x, dy = torch.randn(64, 32), torch.randn(64, 64)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        grouped(x, [64, 0]).backward(dy)
        linears[0](x).backward(dy)
    assert torch.equal(grouped.weight0.main_grad, linears[0].weight.main_grad)
    assert not grouped.weight1.main_grad.any() and grouped.weight0.grad is None
    # Megatron-LM's attribute: every weight, the empty expert's too, gets TE's placeholder gradient.
    for w in grouped.weights:
        w.grad_added_to_main_grad = False
    with mst.autocast(recipe=MXFP8BlockScaling()):
        grouped(x, [64, 0]).backward(dy)
    assert all(w.grad_added_to_main_grad and w.grad.shape == w.shape for w in grouped.weights)
    assert not grouped.weight1.main_grad.any()


def test_grouped_linear_traced_whole_by_torch_compile():
    torch._dynamo.reset()
    torch.manual_seed(5)
    grouped = mst.GroupedLinear(2, 64, 32)
    compiled = torch.compile(grouped, backend="aot_eager", fullgraph=True)
    x, dy = torch.randn(64, 64), torch.randn(64, 32)
    recipe = NVFP4BlockScaling()
    want = step(lambda t: grouped(t, [32, 32]), list(grouped.parameters()), x, dy, recipe)
    got = step(lambda t: compiled(t, [32, 32]), list(grouped.parameters()), x, dy, recipe)
    for n, (a, b) in enumerate(zip(got, want)):
        if n in (3, 5):  # bias gradients: float64 column sums in torch's order and the C++ layer's
            assert torch.allclose(a, b, rtol=2.0**-23, atol=0), n
        else:
            assert torch.equal(a, b), n
    torch._dynamo.reset()


def test_grouped_linear_shapes_and_split_forms():
    grouped = mst.GroupedLinear(2, 32, 64)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        assert grouped(torch.randn(4, 0, 32), [0, 0]).shape == (4, 0, 64)  # no rows at all
        y = grouped(torch.randn(2, 32, 32), torch.tensor([32, 32], dtype=torch.int32))
    assert y.shape == (2, 32, 64)
    for bad in (torch.tensor([32.0, 32.0]), [32.0, 32.0], torch.tensor([[32, 32]])):
        with pytest.raises(ms.Error, match="m_splits must be"):
            grouped(torch.randn(64, 32), bad)


def test_an_empty_expert_keeps_no_older_weight():
    # Step k keeps expert 1's quantization (True); the optimizer changes the weights; on step k+1
    # expert 1 gets no rows on the first micro-batch (True), then rows on the next (False): it must
    # quantize its new weight, not reuse step k's (TransformerEngine quantizes every expert's
    # weight on a first micro-batch).
    torch.manual_seed(6)
    grouped = mst.GroupedLinear(2, 32, 64, bias=False)
    optimizer = torch.optim.SGD(grouped.parameters(), lr=0.5)
    x = torch.randn(64, 32)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        grouped(x, [32, 32], is_first_microbatch=True).square().sum().backward()
        optimizer.step()
        grouped(x, [64, 0], is_first_microbatch=True)
        got = grouped(x, [32, 32], is_first_microbatch=False)
        want = grouped(x, [32, 32])  # quantizes both weights as they are now
    assert torch.equal(got, want)


def test_traced_grouped_linear_with_an_empty_expert():
    torch._dynamo.reset()
    torch.manual_seed(7)
    x, dy = torch.randn(64, 64), torch.randn(64, 32)
    for fused in (False, True):
        grouped = mst.GroupedLinear(2, 64, 32, fuse_wgrad_accumulation=fused)
        for w in grouped.weights:
            w.main_grad = torch.zeros(32, 64)
        compiled = torch.compile(grouped, backend="aot_eager", fullgraph=not fused)
        results = []
        for forward in (grouped, compiled):
            with mst.autocast(recipe=MXFP8BlockScaling()):
                y = forward(x, [64, 0])
            y.backward(dy)
            results.append([y.detach()] + [t.clone() for w in grouped.weights
                                            for t in ((w.main_grad,) if fused else (w.grad,))])
            for w in grouped.weights:
                w.grad = None
                w.main_grad.zero_()
        for a, b in zip(*results):
            assert torch.equal(a, b), fused
        torch._dynamo.reset()
