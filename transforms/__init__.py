"""Composite Beam PTransforms of thresher, each beside its pure numpy kernel, grouped by
concern into six subpackages. From the bottom layer up; a module imports modules of its
own subpackage or of a lower layer, never a higher one (tests/transforms/test_import_graph.py):

1. ``plumbing`` -- the Arrow coder, the file-backed shuffle, the batch columns, the key shuffle;
2. ``randomness`` -- samplers, keyed streams, hashes, user identities, secret commitments;
3. ``bounding`` -- the user-sharded shuffle and per-user contribution bounding;
4. ``selection`` -- which keys are released, with what noise (thresholds, public domains);
5. ``values`` (sums and means beside the count) and ``trees`` (heavy hitters, quantiles),
   side by side: neither imports the other.

Nothing here imports ``thresher.pipelines``; every subpackage's ``__init__`` says what lives
there and what it may import.

**Old module paths.** Until issue 37 the modules sat side by side here, as
``thresher.transforms.<module>`` (``keyed_random``, ``user_shards``, ... : the keys of
MOVED). Those paths keep working for code written against them: importing one (or
reading it as an attribute of this package) gives the module at its new place, the same
module object, so classes and pickles are the same. The code of thresher itself uses only
the new paths (the import-graph test checks it).
"""
import importlib
import importlib.abc
import importlib.util
import sys

# old module name -> its subpackage (the grouping of issue 37)
MOVED = {
    **dict.fromkeys(("arrow_coder", "spill", "aggregate"), "plumbing"),
    **dict.fromkeys(("hashing", "samplers", "block_prf", "stream_construction", "keyed_random",
                     "secret_commitment", "user_identity"), "randomness"),
    **dict.fromkeys(("user_shards", "per_user_bound", "rand_clip", "prereduce", "scored_bound",
                     "choose_contribution_bound", "key_value_bound", "prereduce_stages",
                     "rand_clip_copies"), "bounding"),
    **dict.fromkeys(("release_fn", "noisy_threshold", "sample_and_threshold", "sanitize_sample",
                     "weighted_threshold", "adaptive_rounds", "public_domain", "unique_keys"),
                    "selection"),
    **dict.fromkeys(("aggregate_values", "choose_clip"), "values"),
    **dict.fromkeys(("heavy_hitters", "quantiles", "quantile_release", "public_cells"), "trees"),
}


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``thresher.transforms.<old module>`` and loads it as the module at its new
    path (the same object: nothing is executed twice)."""

    def find_spec(self, name, path=None, target=None):
        package, _, old = name.rpartition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        old = spec.name.rpartition(".")[2]
        module = importlib.import_module(f"{__name__}.{MOVED[old]}.{old}")
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # the import system set the alias spec on the module: give it back its own
        real = getattr(module.__spec__, "loader_state", None)
        if real is not None and real.name == module.__name__:
            module.__spec__ = real


if not any(isinstance(f, _OldPath) for f in sys.meta_path):
    sys.meta_path.append(_OldPath())


def __getattr__(name):
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
