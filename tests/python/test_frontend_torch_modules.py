"""microscale.torch's LayerNormLinear and LayerNormMLP (TransformerEngine's modules of those
names): their parameters as TransformerEngine names them, the normalizations against float64,
the activations against TransformerEngine's kernels' formulas in float64, and each module
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
    for recipe in (NVFP4BlockScaling(), MXFP8BlockScaling(), MXFP8BlockScaling(enable_2d_quantization=True)):
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


# TransformerEngine's formulas (transformer_engine/common/util/math.h) in float64: value, derivative.
def _sigmoid64(x):
    return 1 / (1 + torch.exp(-x))


def _dsigmoid64(x):
    s = _sigmoid64(x)
    return s * (1 - s)


def _dgelu64(x):
    t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    return 0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t)


REFERENCE = {
    "gelu": (lambda x: x * (0.5 + 0.5 * torch.tanh(x * (0.79788456 + 0.03567741 * x * x))), _dgelu64),
    "qgelu": (lambda x: x * _sigmoid64(1.702 * x),
              lambda x: 1.702 * x * _dsigmoid64(1.702 * x) + _sigmoid64(1.702 * x)),
    "relu": (lambda x: torch.where(x > 0, x, 0.0), lambda x: (x > 0).double()),
    "srelu": (lambda x: torch.where(x > 0, x * x, 0.0), lambda x: torch.where(x > 0, 2 * x, 0.0)),
    "silu": (lambda x: x * _sigmoid64(x), lambda x: x * _dsigmoid64(x) + _sigmoid64(x)),
    "sigmoid": (_sigmoid64, _dsigmoid64),
}
BASE = {"gelu": "gelu", "geglu": "gelu", "qgelu": "qgelu", "qgeglu": "qgelu", "relu": "relu", "reglu": "relu",
        "srelu": "srelu", "sreglu": "srelu", "silu": "silu", "swiglu": "silu", "glu": "sigmoid"}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_are_transformer_engines_kernels(name):
    """TransformerEngine's formulas in fp32, rounded once to bf16, forward and backward: bit for bit
    against the formulas written out here, evaluated in fp32 (the same operations in the same
    order), and near their float64 values (where fp32 does not cancel: gelu's 0.5 + 0.5 tanh for
    large negative inputs loses its digits in TransformerEngine's kernels as here)."""
    g = torch.Generator().manual_seed(len(name))
    x = (torch.randn(64, 96, generator=g) * 3).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(64, 48 if ACTIVATIONS[name][2] else 96, generator=g).to(torch.bfloat16)
    y = activate(x, name)
    y.backward(dy)
    function, derivative = REFERENCE[BASE[name]]

    def reference(dtype):
        xr, dyr = x.detach().to(dtype), dy.to(dtype)
        if not ACTIVATIONS[name][2]:
            return function(xr), dyr * derivative(xr)
        a, b = xr.chunk(2, dim=-1)
        return function(a) * b, torch.cat([derivative(a) * dyr * b, function(a) * dyr], dim=-1)

    for got, want32, want64 in zip((y, x.grad), reference(torch.float32), reference(torch.float64)):
        assert got.dtype == torch.bfloat16 and got.shape == want32.shape
        assert torch.equal(got, want32.to(torch.bfloat16)), name
        away = want64.abs() >= 1e-2
        assert bool(((got.double() - want64).abs() <= 2.0**-7 * want64.abs())[away].all()), name
        if BASE[name] in ("relu", "srelu"):  # exact arithmetic before the rounding
            assert torch.equal(got, want64.to(torch.bfloat16)), name


def test_gated_activations_round_once():
    # TransformerEngine's gated kernels multiply act(a) by b in fp32 and round once; computing op by
    # op in bf16 would round act(a) first.
    x = (torch.randn(256, 512, generator=torch.Generator().manual_seed(7)) * 2).to(torch.bfloat16)
    a, b = x.chunk(2, dim=-1)
    once = (a.float() * torch.where(a > 0, a, 0).float() * b.float()).to(torch.bfloat16)  # srelu(a) * b
    twice = torch.relu(a).square() * b
    assert torch.equal(activate(x, "sreglu"), once) and not torch.equal(once, twice)


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


@pytest.mark.parametrize("module_class", [mst.LayerNorm, mst.RMSNorm])
@pytest.mark.parametrize("zero_centered_gamma", [False, True])
def test_standalone_norms(module_class, zero_centered_gamma):
    """TransformerEngine's LayerNorm and RMSNorm: its parameter names, gamma 1 and beta 0 to begin
    with, against float64 rounded once (within one bf16 ulp), and gradients for the parameters."""
    module = module_class(64, eps=1e-6, params_dtype=torch.bfloat16, zero_centered_gamma=zero_centered_gamma)
    layer_norm = module_class is mst.LayerNorm
    assert set(module.state_dict()) == ({"weight", "bias"} if layer_norm else {"weight"})
    assert bool((module.weight == (0 if zero_centered_gamma else 1)).all())
    with torch.no_grad():
        module.weight.add_(torch.linspace(-0.5, 0.5, 64).to(torch.bfloat16))
        if layer_norm:
            module.bias.add_(0.25)
    x = (torch.randn(2, 16, 64) * 3 + 1).to(torch.bfloat16).requires_grad_()
    y = module(x)
    gamma = module.weight.float() + (1 if zero_centered_gamma else 0)
    want = reference_norm(x.detach(), "LayerNorm" if layer_norm else "RMSNorm", gamma, module.bias, module.eps)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert bool(((y.double() - want.double()).abs() <= 2.0**-7 * want.double().abs() + 1e-6).all())
    y.float().sum().backward()
    assert x.grad is not None and module.weight.grad is not None
    with pytest.raises(TypeError):
        module_class(64, 1e-5, False)  # TE's third positional argument is sequence_parallel
