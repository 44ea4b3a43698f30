"""SecureRandom: the os.urandom-backed source every release uses.

It cannot be seeded (by design), so these statistical tests are the only unseeded ones
in the suite; each states its false-failure probability (at most 1e-9)."""
import pickle

import numpy as np
import pytest
from scipy import stats

from tests.transforms.randomness import gof
from thresher.transforms.randomness import samplers

ALPHA_UNSEEDED = 1e-9


def test_bits_are_uniform_in_every_position():
    words = samplers.secure_random().bits(1_000_000)
    assert words.dtype == np.uint64 and words.shape == (1_000_000,)
    ones = np.array([int(np.count_nonzero((words >> np.uint64(b)) & np.uint64(1))) for b in range(64)])
    # two-sided binomial test per bit position, Bonferroni over 64 positions
    p = np.array([stats.binomtest(int(k), words.size, 0.5).pvalue for k in ones])
    assert p.min() > ALPHA_UNSEEDED / 64


def test_integers_are_uniform_and_in_range():
    rng = samplers.secure_random()
    values = rng.integers(3, 13, size=200_000)
    assert values.min() >= 3 and values.max() <= 12
    counts = np.bincount(values - 3, minlength=10)
    assert stats.chisquare(counts).pvalue > ALPHA_UNSEEDED


def test_secure_random_refuses_to_be_pickled():
    with pytest.raises(TypeError, match="DoFn.setup"):
        pickle.dumps(samplers.secure_random())


@pytest.mark.parametrize("sampler,param,pmf", [
    (samplers.discrete_gaussian, 3.0, gof.discrete_gaussian_pmf),
    (samplers.discrete_laplace, 2.0, gof.discrete_laplace_pmf),
])
def test_samplers_driven_by_secure_random_have_the_right_pmf(sampler, param, pmf):
    draws = sampler(samplers.secure_random(), param, 500_000)
    assert gof.chi_square_pvalue(draws, lambda x: pmf(param, x)) > ALPHA_UNSEEDED


def test_bernoulli_driven_by_secure_random():
    coins = samplers.bernoulli(samplers.secure_random(), 0.105, 500_000)
    assert stats.binomtest(int(coins.sum()), coins.size, 0.105).pvalue > ALPHA_UNSEEDED
