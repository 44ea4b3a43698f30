"""Run in a fresh interpreter by test_pickling.py: unpickle every DoFn and CombineFn of
serialised pipelines (Runner API protos) the way an SDK worker does, inspect what was
shipped, call setup()/teardown(), and print a JSON verdict per pipeline.

Nothing of the pipeline's construction ran in this process, so a function that depends on
a module global set while the pipeline was built fails here."""
import io
import json
import random
import socket
import sys

import numpy as np
from apache_beam.internal import pickler
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms.core import DoFn

FORBIDDEN = (np.random.Generator, np.random.RandomState, np.random.BitGenerator,
             random.Random, io.IOBase, socket.socket)


def _shipped_state(obj, path, found, depth=0, seen=None):
    """Names of attributes (recursively, through containers) holding RNGs or open files."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    from thresher.transforms.randomness.samplers import SecureRandom
    if isinstance(obj, FORBIDDEN + (SecureRandom,)):
        found.append(f"{path}: {type(obj).__name__}")
        return
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] == "thresher":
        items = vars(obj).items()
    else:
        return
    for name, value in items:
        _shipped_state(value, f"{path}.{name}", found, depth + 1, seen)


def audit(proto_bytes):
    proto = beam_runner_api_pb2.Pipeline.FromString(proto_bytes)
    dofns, combinefns, problems, rngs = [], [], [], []
    for tid, transform in proto.components.transforms.items():
        urn = transform.spec.urn
        if urn == common_urns.primitives.PAR_DO.urn:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            if payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO:
                continue
            fn = pickler.loads(payload.do_fn.payload)[0]
            name = f"{transform.unique_name} ({type(fn).__name__})"
            dofns.append(name)
        elif urn == common_urns.composites.COMBINE_PER_KEY.urn:
            payload = beam_runner_api_pb2.CombinePayload.FromString(transform.spec.payload)
            fn = pickler.loads(payload.combine_fn.payload)
            name = f"{transform.unique_name} ({type(fn).__name__})"
            combinefns.append(name)
        else:
            continue
        found = []
        _shipped_state(fn, name, found)
        problems.extend(found)
        if isinstance(fn, DoFn):
            fn.setup()
            # a DoFn that draws (keyed_random.par_do wraps it to hand it the secret)
            drawing = getattr(fn, "_inner", fn)
            if hasattr(drawing, "_rng_factory"):   # what it draws from
                source = drawing._rng_factory
                rng = getattr(drawing, "_rng", None)
                rngs.append(f"{name}: {type(source).__module__}.{type(source).__name__}"
                            f" (setup made {type(rng).__name__})")
            fn.teardown()
    return {"dofns": dofns, "combinefns": combinefns, "problems": problems, "rngs": rngs}


if __name__ == "__main__":
    verdicts = {}
    for name, path in json.loads(sys.argv[1]).items():
        with open(path, "rb") as handle:
            verdicts[name] = audit(handle.read())
    print(json.dumps(verdicts))
