"""microscale.torch's LayerNormLinear and LayerNormMLP (TransformerEngine's modules of those
names): their parameters as TransformerEngine names them, the normalizations against float64,
the activations against TransformerEngine's own PyTorch reference formulas, and each module
against the composition of its pieces (the quantized Linear bit for bit), forward and backward.

Needs the extension built (scripts/test.sh sets PYTHONPATH=build/release/python) and torch."""

import pytest
import torch

import microscale as ms
import microscale.torch as mst
from microscale.recipe import MXFP8BlockScaling, NVFP4BlockScaling
from microscale.torch.activations import ACTIVATIONS, activate


def reference_norm(x, normalization, gamma, beta, eps):
    """In float64, rounded once to x's dtype."""
    x64 = x.double()
    if normalization == "LayerNorm":
        mean = x64.mean(-1, keepdim=True)
        var = ((x64 - mean) ** 2).mean(-1, keepdim=True)
        out = (x64 - mean) / torch.sqrt(var + eps) * gamma.double() + beta.double()
    else:
        out = x64 / torch.sqrt((x64**2).mean(-1, keepdim=True) + eps) * gamma.double()
    return out.to(x.dtype)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
def test_layernorm_linear(normalization, zero_centered_gamma):
    torch.manual_seed(0)
    module = mst.LayerNormLinear(64, 96, normalization=normalization, zero_centered_gamma=zero_centered_gamma,
                                 return_layernorm_output=True, return_bias=True, params_dtype=torch.bfloat16)
    names = {"layer_norm_weight", "weight", "bias"} | ({"layer_norm_bias"} if normalization == "LayerNorm" else set())
    assert set(module.state_dict()) == names  # TransformerEngine's names: its state dicts load
    assert bool((module.layer_norm_weight == (0 if zero_centered_gamma else 1)).all())
    with torch.no_grad():  # a gamma and beta that are not the identity
        module.layer_norm_weight.add_(torch.linspace(-0.5, 0.5, 64).to(torch.bfloat16))
        if module.layer_norm_bias is not None:
            module.layer_norm_bias.add_(0.25)
    linear = mst.Linear(64, 96, bias=False, params_dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(module.weight)
    x = (torch.randn(2, 16, 64) * 3 + 1).to(torch.bfloat16)
    gamma = module.layer_norm_weight.float() + (1 if zero_centered_gamma else 0)
    want_ln = reference_norm(x, normalization, gamma, module.layer_norm_bias, module.eps)
    for recipe in (NVFP4BlockScaling(), MXFP8BlockScaling()):
        xg = x.clone().requires_grad_()
        with mst.autocast(recipe=recipe):
            y, bias, ln_out = module(xg)
            want_y = linear(ln_out.detach())
        ulp = 2.0**-7 * want_ln.double().abs() + 1e-6
        assert ln_out.dtype == torch.bfloat16 and bool(((ln_out.double() - want_ln.double()).abs() <= ulp).all())
        assert torch.equal(y, want_y) and torch.equal(bias, module.bias)
        (y + bias).float().square().sum().backward()
        assert xg.grad is not None and module.layer_norm_weight.grad is not None and module.weight.grad is not None
        module.zero_grad()


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_layernorm_mlp_is_its_pieces(activation):
    torch.manual_seed(1)
    module = mst.LayerNormMLP(64, 96, activation=activation, params_dtype=torch.bfloat16)
    gated = activation in ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu")
    assert module.fc1_weight.shape == ((192 if gated else 96), 64) and module.fc2_weight.shape == (64, 96)
    assert set(module.state_dict()) == {"layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias",
                                        "fc2_weight", "fc2_bias"}
    fc1 = mst.Linear(64, module.fc1_weight.shape[0], params_dtype=torch.bfloat16)
    fc2 = mst.Linear(96, 64, params_dtype=torch.bfloat16)
    with torch.no_grad():
        for linear, w, b in ((fc1, module.fc1_weight, module.fc1_bias), (fc2, module.fc2_weight, module.fc2_bias)):
            linear.weight.copy_(w)
            linear.bias.copy_(b)
    x = torch.randn(32, 64).to(torch.bfloat16)
    with mst.autocast(recipe=MXFP8BlockScaling()):
        y = module(x.clone().requires_grad_())
        ln = torch.nn.LayerNorm(64, eps=module.eps, dtype=torch.float32)  # gamma 1, beta 0: the module's start
        want = fc2(activate(fc1(ln(x.float()).to(torch.bfloat16)), activation))
    assert torch.equal(y, want)
    y.float().sum().backward()
    assert module.fc1_weight.grad.shape == module.fc1_weight.shape and module.fc2_bias.grad.shape == (64,)
    assert module.weight_quantizations == 2


def test_activations_are_transformer_engines_reference():
    """TransformerEngine's tests define them so (tests/pytorch/test_numerics.py, in the input dtype)."""
    x = torch.randn(8, 16, dtype=torch.float64)
    a, b = x[:, :8], x[:, 8:]
    assert torch.equal(activate(x, "qgelu"), x * torch.sigmoid(1.702 * x))
    assert torch.equal(activate(x, "srelu"), (x > 0) * x * x)
    assert torch.equal(activate(x, "gelu"), torch.nn.functional.gelu(x, approximate="tanh"))
    assert torch.equal(activate(x, "swiglu"), torch.nn.functional.silu(a) * b)
    assert torch.equal(activate(x, "glu"), torch.sigmoid(a) * b)
    assert torch.equal(activate(x, "reglu"), torch.relu(a) * b)


def test_module_options_and_errors():
    with pytest.raises(ms.Error, match="unknown normalization"):
        mst.LayerNormLinear(64, 32, normalization="BatchNorm")
    with pytest.raises(ms.Error, match="unknown activation"):
        mst.LayerNormMLP(64, 32, activation="tanh")
    module = mst.LayerNormMLP(64, 32, bias=False, normalization="RMSNorm", return_bias=True,
                              return_layernorm_output=True,
                              init_method=lambda w: torch.nn.init.constant_(w, 0.01),
                              output_layer_init_method=lambda w: torch.nn.init.constant_(w, 0.02))
    assert set(module.state_dict()) == {"layer_norm_weight", "fc1_weight", "fc2_weight"}
    assert bool((module.fc1_weight == 0.01).all()) and bool((module.fc2_weight == 0.02).all())
    y, bias, ln_out = module(torch.randn(16, 64))
    assert y.shape == (16, 64) and bias.numel() == 0 and ln_out.shape == (16, 64)
    # A TransformerEngine module's state dict carries "_extra_state" (its FP8 metadata): it loads strictly.
    for layer in (module, mst.LayerNormLinear(64, 32), mst.Linear(64, 32)):
        state = layer.state_dict()
        state["_extra_state"] = torch.empty(0)
        layer.load_state_dict(state)
        assert "_extra_state" not in layer.state_dict()
    with pytest.raises(TypeError):
        mst.LayerNormLinear(64, 32, 1e-5, False)  # TE's 4th positional argument is sequence_parallel
