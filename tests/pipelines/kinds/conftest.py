import os
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def cli(tmp_path):
    """Write a spec dict to tmp_path and run the real CLI on it in a new process;
    returns the CompletedProcess."""
    def _run(spec, command="run", name="spec.yaml", extra=()):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(spec, allow_unicode=True))
        return subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", command, str(path), *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)
    return _run


def level_pair_delta(epsilon, p, tau, group, k_max):
    """max over k in [1, k_max] of the hockey-stick divergence, both directions, between
    "Bin(k, p) if >= tau else absent" and the same with k - group (clipped at 0): one cell
    losing ``group`` contributions, computed from scipy's pmf directly (no reduction)."""
    import numpy as np
    from scipy import stats
    e = np.exp(epsilon)
    best = 0.0
    for k in range(1, k_max + 1):
        v = np.arange(0, k + 1)
        a = stats.binom.pmf(v, k, p)
        b = stats.binom.pmf(v, max(k - group, 0), p)
        a_out = np.concatenate([[a[v < tau].sum()], a[v >= tau]])
        b_out = np.concatenate([[b[v < tau].sum()], b[v >= tau]])
        best = max(best, np.maximum(a_out - e * b_out, 0).sum(), np.maximum(b_out - e * a_out, 0).sum())
    return best
