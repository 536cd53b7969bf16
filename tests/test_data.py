"""lessonlib.measure.data: seeded, so the same seed gives the same numbers."""
import pytest
import torch

from lessonlib.measure import data


def test_sales_seeded_and_nonnegative():
    a, b = data.make_sales(seed=3), data.make_sales(seed=3)
    assert torch.equal(a, b)
    assert a.shape == (20, 730) and (a >= 0).all()
    assert not torch.equal(a, data.make_sales(seed=4))


def test_forecast_dataset_windows():
    X, y = data.make_forecast_dataset(window=7, n_stores=2, n_days=30)
    assert X.shape == (2 * (30 - 7), 7) and y.shape == (2 * (30 - 7), 1)
    # the target of one example is the last input of the next example of the same store
    assert X[1, -1] == y[0, 0]


def test_tokens_are_shifted():
    x, y = data.make_tokens(2, 10, vocab=5)
    assert torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("fn,kwargs,word", [
    (data.make_sales, dict(n_stores=0), "n_stores"),
    (data.make_forecast_dataset, dict(window=1000), "window"),
    (data.make_tokens, dict(batch=1, seq_len=-1), "seq_len"),
    (data.make_regression, dict(n=2.5), "n"),
])
def test_bad_input(fn, kwargs, word):
    with pytest.raises(ValueError, match=word):
        fn(**kwargs)
