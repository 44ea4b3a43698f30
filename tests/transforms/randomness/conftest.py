"""Fixtures shared by the sampler tests."""
import pytest

from thresher.transforms.randomness import samplers


@pytest.fixture
def fresh_caches():
    """Samplers built under patched constants must not leak into other tests."""
    samplers._cached_geometric.cache_clear()
    samplers._cached_gaussian.cache_clear()
    yield
    samplers._cached_geometric.cache_clear()
    samplers._cached_gaussian.cache_clear()
