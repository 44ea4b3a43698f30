"""Settings for the whole test suite."""
import os

# The thresher command keeps calibrations in a per-user cache (pipelines/calibration_cache.py).
# The suite computes every calibration (and writes nothing under the home folder); the
# cache's own tests point THRESHER_CACHE_DIR at a temporary folder.
os.environ["THRESHER_CACHE_DIR"] = "off"   # whatever the environment says
