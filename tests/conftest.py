"""Settings for the whole test suite."""
import os

# The thresher command keeps calibrations in a per-user cache (pipelines/calibration_cache.py).
# The suite computes every calibration (and writes nothing under the home folder); the
# cache's own tests point THRESHER_CACHE_DIR at a temporary folder.
os.environ["THRESHER_CACHE_DIR"] = "off"   # whatever the environment says

# No timed assertions in the suite (speed is measured by benchmarks): hypothesis's default
# 200 ms per-example deadline would fail a property test on a loaded machine.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("thresher", deadline=None)
_hypothesis_settings.load_profile("thresher")
