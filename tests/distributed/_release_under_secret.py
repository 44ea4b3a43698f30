"""Test-only: run a release under a fixed secret, as tests/pipelines/running/test_keyed_recomputation.py
does in process, for a run that must happen in another process (inside the loopback
network namespace of ``loopback_netns.py``).

    python tests/distributed/_release_under_secret.py SPEC SECRET_HEX [-- <Beam options>]

The secret reaches the SDK workers the way production's does: the ``KeyedSource`` is
pickled with the stages that draw from it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from thresher.pipelines.running import release  # noqa: E402

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan  # noqa: E402
from thresher.transforms.randomness.keyed_random import KeyedSource  # noqa: E402


def main(argv):
    own, beam_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    spec_path, secret_hex = own
    from thresher.pipelines.running import engines
    beam_args = engines.complete_beam_args(beam_args)   # as `thresher run` does
    release.run(make_plan(spec_mod.load(spec_path)), beam_args,
                rng_factory=KeyedSource(bytes.fromhex(secret_hex)))


if __name__ == "__main__":
    main(sys.argv[1:])
