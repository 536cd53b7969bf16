"""lessonlib.measure.models: shapes, parameter counts, the 1-byte dropout mask."""
import pytest
import torch

from lessonlib.measure import models


def test_forecast_mlp_shapes_and_params():
    m = models.ForecastMLP(window=28, hidden=64, layers=2)
    assert m(torch.zeros(5, 28)).shape == (5, 1)
    assert models.n_params(m) == 28 * 64 + 64 + 64 * 64 + 64 + 64 + 1


def test_tiny_gpt_shapes():
    g = models.TinyGPT(vocab=50, seq_len=16, hidden=32, heads=4, layers=2)
    idx = torch.randint(0, 50, (3, 16))
    logits = g(idx)
    assert logits.shape == (3, 16, 50)
    loss = models.lm_loss(logits, idx)
    loss.backward()
    assert all(p.grad is not None for p in g.parameters())


def test_block_param_count():
    h = 32
    g = models.TinyGPT(vocab=10, seq_len=8, hidden=h, heads=4, layers=1)
    # 12h^2 + 13h per layer (qkv, proj, fc1, fc2 with biases; two LayerNorms)
    assert models.n_params(g.blocks) == 12 * h * h + 13 * h


def test_native_dropout_mask_is_one_byte():
    d = models.Dropout(0.5)
    x = torch.randn(100, requires_grad=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        d(x).sum()
    assert [t.dtype for t in kept] == [torch.bool]


def test_math_and_sdpa_agree_without_dropout():
    torch.manual_seed(0)
    a = models.TinyGPT(vocab=20, seq_len=8, hidden=16, heads=2, layers=1, dropout=0.0)
    b = models.TinyGPT(vocab=20, seq_len=8, hidden=16, heads=2, layers=1, dropout=0.0, attention="sdpa")
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 20, (2, 8))
    # float32 round-off between two attention kernels
    torch.testing.assert_close(a(idx), b(idx), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs,word", [
    (dict(hidden=0), "hidden"), (dict(layers=1.5), "layers"), (dict(hidden=10, heads=3), "divisible"),
    (dict(dropout_impl="x"), "dropout_impl"), (dict(attention="flash"), "attention"),  # the caller's name, not the inner "impl"
])
def test_gpt_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        models.TinyGPT(**kwargs)


def test_mlp_bad_input():
    with pytest.raises(ValueError, match="window"):
        models.ForecastMLP(window=0)
    with pytest.raises(ValueError, match="p must"):
        models.Dropout(1.0)


def test_the_public_checkers_name_the_callers_argument_and_their_own():
    """check_module and check_tensor name the argument their caller passes in ``name``; a bad ``name`` or
    ``floating`` is refused naming their own parameter."""
    import pytest
    import torch

    from lessonlib.measure.models import check_module, check_size, check_tensor

    lin = torch.nn.Linear(2, 2)
    assert check_module("model", lin) is lin
    t = torch.ones(2)
    assert check_tensor("inputs", t, floating=True) is t
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        check_module("model", 1.0)
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor"):
        check_tensor("inputs", [1.0])
    with pytest.raises(TypeError, match="inputs must be a floating-point tensor"):
        check_tensor("inputs", torch.ones(2, dtype=torch.int64), floating=True)
    with pytest.raises(ValueError, match="model has no parameters"):
        check_module("model", torch.nn.ReLU())
    with pytest.raises((TypeError, ValueError), match="name"):
        check_tensor(3, t)
    with pytest.raises((TypeError, ValueError), match="floating"):
        check_tensor("inputs", t, floating="yes")
    # a count too large for any check is still the caller's arguments' fault, named by ``what``
    with pytest.raises(ValueError, match="hidden and layers give about"):
        check_size("hidden and layers", 5.9e35)
    assert check_size("hidden", 10) == 10
