"""One secret per run, or the run fails: commitments to the release secret (issue 36 P2).

The release secret is drawn once inside the pipeline and pinned by a Reshuffle
(``keyed_random.PipelineSecret``), and every stage that draws reads it as a singleton side
input. A runner that recomputes the secret's PCollection after a failure (Flink maps
Reshuffle to a rebalance; Spark recomputes lost partitions from their lineage) could hand
two consumers -- or two reader bundles -- two different secrets: one user would then have
two identities (``transforms.randomness.user_identity``), land in two user shards and be bounded
twice, a contribution bound of 2C where C was claimed. A check per shard cannot see it
(the two identities are in different shards), so the check is global:

* every stage that reads the secret (each DoFn applied with ``keyed_random.par_do`` under
  a ``PipelineSecret``, the record reader's ``PrepareBatches`` among them, so every prepared
  batch) emits, once per bundle and per secret it saw, a **commitment**: the first 16
  bytes of the secret's stage key for the reserved stage :data:`COMMITMENT_STAGE`, a PRF
  output (``KeyedSource.stage_key``), never the secret; the stage name starts with a NUL,
  so no stage label draws from it (as ``user_identity.IDENTITY_STAGE``);
* the commitments of all those stages are side inputs of the **publisher**
  (:func:`publisher`, the stage that writes the released file of ``thresher run``;
  :class:`OneSecret` before the Beam YAML transform's outputs), which reads the
  secret itself and refuses -- :class:`MixedSecretsError`, exit 2, raised in the pipeline
  so the run fails and nothing is published -- unless every commitment equals its own: the
  set of commitments of the run, its own included, has exactly one element.

Two distinct secrets give equal commitments with probability 2**-128 (a PRF); a
commitment reveals nothing about the secret or any other stage's key.

The publisher is added last: once it holds the commitments (:func:`sealed`), a stage
that reads the secret and is added later would go unchecked, so adding one is an error
when the pipeline is built. With a ``KeyedSource`` given explicitly (tests) the secret is
in the graph, one value by construction, and nothing is added.
"""
import weakref

import apache_beam as beam

from thresher.errors import ThresherError
from thresher.transforms.randomness import keyed_random

COMMITMENT_STAGE = "\x00thresher/secret-commitment"   # NUL: no stage label is this stage
COMMITMENTS = "thresher_secret_commitments"          # the tagged output of a secret reader
COMMITMENT_BYTES = 16


def commitment(source):
    """The commitment of the secret a source holds (module docstring)."""
    return bytes(source.stage_key(COMMITMENT_STAGE)[:COMMITMENT_BYTES])


class MixedSecretsError(ThresherError):
    """Stages of one run saw different release secrets (exit 2; nothing is published)."""

    def __init__(self, distinct):
        super().__init__(
            f"the stages of this run read {distinct} different release secrets (the runner "
            f"recomputed the stage that draws the secret, e.g. after a worker failure), so "
            f"one user could have had two identities and twice their contribution bound; "
            f"nothing was published and the run fails. Run it again (docs/running.md, "
            f"'Randomness: the release secret')")


def check(own, commitments):
    """Raise :class:`MixedSecretsError` unless every commitment equals ``own``."""
    distinct = {bytes(c) for c in commitments} | {bytes(own)}
    if len(distinct) != 1:
        raise MixedSecretsError(len(distinct))


# ---- build time: which stages read the secret ------------------------------------------

class _Registry:
    def __init__(self):
        self.readers = []       # (main output, commitments) of each stage that reads it
        self.sealed = False


_REGISTRIES = weakref.WeakKeyDictionary()     # PipelineSecret -> _Registry


def _registry(source):
    registry = _REGISTRIES.get(source)
    if registry is None:
        registry = _REGISTRIES[source] = _Registry()
    return registry


def _register(source, main, commitments):
    registry = _registry(source)
    if registry.sealed:
        raise RuntimeError("a stage that reads the release secret was added after the "
                           "publisher's check of its commitments: add it before "
                           "secret_commitment.publisher / OneSecret")
    registry.readers.append((main, commitments))


def _attach(main, commitments):
    """Make ``commitments`` the :data:`COMMITMENTS` output of the ParDo that produced
    ``main``, as Beam attaches a tagged output it is asked for after the fact
    (``pvalue.DoOutputsTuple``): the ParDo's application is ``main.producer``, known once
    it was applied. Until then its commitments are emitted to no consumer (dropped)."""
    applied = main.producer
    if COMMITMENTS not in applied.outputs:
        applied.transform.output_tags.add(COMMITMENTS)
        commitments.producer = applied
        applied.add_output(commitments, COMMITMENTS)
    return commitments


def sealed(source):
    """The side inputs of a publisher: one list of commitments per stage that reads the
    secret (each its own side input: a Flatten of them would cost the in-process runner
    one more fused stage) and ``release_secret``; no registration after it."""
    registry = _registry(source)
    registry.sealed = True
    return ([beam.pvalue.AsList(_attach(main, c)) for main, c in registry.readers],
            {"release_secret": source.side_input()})


class CommittedParDo(beam.ParDo):
    """``keyed_random.par_do`` under a ``PipelineSecret``: the ParDo of
    ``keyed_random._WithSecret(dofn)`` (the secret's side input set on the DoFn's source
    before each element) with one more output, :data:`COMMITMENTS`, registered for the
    publisher, which attaches it to this ParDo's application when it seals the readers
    (:func:`sealed`; no private Beam API: the application is the main output's
    ``producer``). Still a ParDo, with the caller's label as its step name: its main
    output, ``with_outputs`` and ``with_output_types`` are the plain ParDo's."""

    def __init__(self, dofn, source, args, kwargs):
        super().__init__(_Committing(dofn), *args, release_secret=source.side_input(),
                         **kwargs)
        self._source = source

    def expand(self, pcoll):
        main = super().expand(pcoll)
        commitments = beam.pvalue.PCollection(pcoll.pipeline, tag=COMMITMENTS,
                                              element_type=bytes, is_bounded=pcoll.is_bounded)
        _register(self._source, main, commitments)
        return main


class _Committing(keyed_random._WithSecret):
    """``_WithSecret`` that also emits, once per bundle and per secret seen, the secret's
    commitment on the :data:`COMMITMENTS` output."""

    def start_bundle(self):
        self._sent = set()
        super().start_bundle()

    def process(self, element, *args, **kwargs):
        secret = kwargs["release_secret"]
        results = super().process(element, *args, **kwargs)
        if secret is not getattr(self, "_last_secret", None):
            self._last_secret = secret
            self._last = commitment(self._inner._rng_factory)
        if self._last not in self._sent:
            self._sent.add(self._last)
            yield beam.pvalue.TaggedOutput(COMMITMENTS, self._last)
        if results is not None:
            yield from results


# ---- the publisher ---------------------------------------------------------------------

def publisher(fn, source, **kwargs):
    """``beam.Map(fn, **kwargs)`` as the release's publisher: under a ``PipelineSecret``
    the stage first checks that every stage of the run read the one secret it reads
    (:func:`check`) and raises :class:`MixedSecretsError` otherwise; with any other
    source (tests: a KeyedSource or seeded generator) the plain Map."""
    if not isinstance(source, keyed_random.PipelineSecret):
        return beam.Map(fn, **kwargs)
    lists, secret = sealed(source)
    return beam.ParDo(_Publish(fn, source), *lists, **secret, **kwargs)


class _Publish(beam.DoFn):
    """Runs ``fn(element, **kwargs)`` once the commitments of every secret reader (one
    list per stage) are known to equal the commitment of the secret this stage reads."""

    def __init__(self, fn, source):
        super().__init__()
        self._fn = fn
        self._source = source

    def process(self, element, *commitment_lists, release_secret, **kwargs):
        self._source.set_secret(release_secret)
        check(commitment(self._source), [c for listed in commitment_lists for c in listed])
        yield self._fn(element, **kwargs)


class OneSecret(beam.PTransform):
    """The released PCollection, passed on only once its run is known to have read one
    secret (the Beam YAML transform's outputs): a one-element check stage, as the CLI's
    publisher checks (:func:`publisher`), is a side input of a pass-through, so no released
    element leaves before the check passed, and a failed check fails the pipeline. Added
    after every stage that reads the secret. Any other source: the input as is."""

    def __init__(self, source):
        super().__init__()
        self._source = source

    def expand(self, released):
        if not isinstance(self._source, keyed_random.PipelineSecret):
            return released
        verdict = (released.pipeline
                   | "Check" >> beam.Impulse()
                   | "OneSecret" >> publisher(_ok, self._source))
        return released | "AfterCheck" >> beam.Map(
            _pass, verdict=beam.pvalue.AsSingleton(verdict)).with_output_types(
                released.element_type)


def _ok(unused_impulse):
    return True


def _pass(element, verdict):
    return element
