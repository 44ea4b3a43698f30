"""``mechanism.kind: heavy_hitters`` -- TrieHH++ top keys by distinct users (paper 003 Sec. 4.1).

One string key column. Each user is bounded to at most C = max_keys_per_user distinct
keys (``PerUserBound``), so a key's count is its number of distinct users. Level i of the
trie releases a sample-and-threshold histogram of the length-``prefix_lengths[i]``
prefixes (characters, i.e. Unicode code points, not bytes; ``null`` = the whole key),
each level with fresh Poisson sampling; a prefix survives only if its parent prefix
survived one level up (the TrieHH trie constraint, post-processing). The released keys
are the last level's survivors, the ``top_k`` of them by estimate.

Output columns: ``count`` (float64): the sampled count at the whole-key level divided by
the sampling rate, v / p -- an unbiased estimate of the key's number of distinct users
after bounding, biased up near the release point tau / p because only v >= tau is
released; ``rank`` (int64): 1 for the largest ``count`` (ties by key).

Privacy (``pipelines/kinds/_levels.py``): the L levels compose (paper 003 Lemma 4.1),
one report stage per level with (epsilon / L, delta / L); each level's prefix cell counts
(user, key) contributions and a user has at most C, so (sampling_rate, threshold) come
from ``accounting.sample_threshold.calibrate_levels`` (exact per-contribution accounting,
group privacy over C). Paper 003 Sec. 4.1 notes that when only the heavy hitters are
wanted the factor L can be dropped: ``prefix_lengths: [null]`` is one level.
"""
import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from thresher.pipelines.errors import InputError, SpecError
from thresher.pipelines.kinds import _levels
from thresher.pipelines.specs import declare
from thresher.pipelines.specs.fields import optional_float
from thresher.transforms.heavy_hitters import LEVEL_COLUMN, TrieHeavyHitters, heavy_hitters

DEFAULT_PREFIX_LENGTHS = (2, 4, None)
DEFAULT_TOP_K = 20

FIELDS = {
    "top_k": declare.integer(low=1, high=10**6, default=DEFAULT_TOP_K, description=(
        f"how many keys to release at most, by decreasing estimate (integer >= 1, default "
        f"{DEFAULT_TOP_K})")),
    "prefix_lengths": declare.array(
        declare.one_of(declare.integer(low=1, high=10**4), {"type": "null"}),
        min_items=1, max_items=64, description=(
            "increasing prefix lengths in characters, null (the whole key) last "
            f"(default {[n for n in DEFAULT_PREFIX_LENGTHS]}; [null] = one level)")),
    "sampling_rate": _levels.SAMPLING_RATE,
    "threshold": _levels.THRESHOLD,
}
OUTPUT_COLUMNS = {"count": pa.float64(), "rank": pa.int64()}


def parse(section):
    top_k = int(section.get("top_k", DEFAULT_TOP_K))
    lengths = section.get("prefix_lengths", list(DEFAULT_PREFIX_LENGTHS))
    parsed = [None if n is None else int(n) for n in lengths]
    finite = [n for n in parsed if n is not None]
    if finite != sorted(set(finite)) or parsed.count(None) > 1 \
            or (None in parsed and parsed[-1] is not None) or len(parsed) > 64:
        raise SpecError("mechanism.prefix_lengths", f"must increase strictly, with null (the "
                        f"whole key) only last, at most 64 levels; got {lengths!r}")
    if parsed[-1] is not None:
        parsed.append(None)  # the released keys are whole keys: the last level is the key
    rate = optional_float(section, "sampling_rate")
    return {"top_k": top_k, "prefix_lengths": parsed, "sampling_rate": rate,
            "threshold": _levels.optional_threshold(section)}


def check_spec(mechanism, input_spec, bounding, privacy):
    _levels.refuse_auto_bound(bounding, "heavy_hitters")
    if len(input_spec.keys) != 1:
        raise SpecError("input.keys", f"heavy_hitters needs exactly one (string) key column, "
                        f"got {list(input_spec.keys)}")
    if input_spec.keys[0] == "rank":
        raise SpecError("input.keys[0]", "'rank' is an output column of heavy_hitters; rename the column")


def stage_names(mechanism):
    return [f"level_{i}_{'whole_key' if n is None else f'prefix_{n}'}"
            for i, n in enumerate(mechanism["prefix_lengths"])]


def level_structure(mechanism):
    """(levels, contributions per level per unit of max_keys_per_user): one histogram per
    prefix length, one contribution per kept key in each (pipelines.limits reads it)."""
    return len(mechanism["prefix_lengths"]), 1


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    levels, _ = level_structure(mech)
    params = _levels.calibrate(mech, epsilon=epsilon, delta=delta, levels=levels,
                               max_keys_per_user=max_keys_per_user,
                               what="heavy_hitters (TrieHH++) release")
    return {"kind": "heavy_hitters", "top_k": mech["top_k"],
            "prefix_lengths": list(mech["prefix_lengths"]),
            **_levels.report_section(params),
            "count": "sampled count / sampling_rate at the whole-key level: distinct users "
                     "after bounding, unbiased above the release point",
            "accounting": "TrieHH++ (paper 003 Sec. 4.1) over prefix levels; "
                          + _levels.accounting("(user, key)"),
            "contributions_per_level": max_keys_per_user}


def _string_keys(table, key):
    column = table.column(key)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise InputError(f"input.keys[0]: heavy_hitters needs a string key column; {key!r} "
                         f"is {column.type}")
    return table


def _top_k(tables, key, top_k):
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return
    top = heavy_hitters(pa.concat_tables(tables), key, top_k)
    ranks = pa.array(range(1, top.num_rows + 1), type=pa.int64())
    yield pa.table({key: top.column(key), "count": top.column("estimate"), "rank": ranks})


class HeavyHittersRelease(beam.PTransform):
    """Table(key, count) of per-key distinct-user counts -> Table(key, count, rank) of the
    top_k TrieHH++ heavy hitters (paper 003 Sec. 4.1). ``params``: dict or side input with
    sampling_rate and threshold."""

    def __init__(self, key, prefix_lengths, top_k, params, num_shards=16, rng_factory=None,
                 label=None):
        super().__init__(label)
        self._key, self._lengths, self._top_k = key, list(prefix_lengths), int(top_k)
        self._params, self._num_shards, self._rng_factory = params, num_shards, rng_factory

    def expand(self, counts):
        return (counts
                | "StringKeys" >> beam.Map(_string_keys, self._key)
                | "TrieHH" >> TrieHeavyHitters(self._key, self._lengths, self._params,
                                               num_shards=self._num_shards,
                                               rng_factory=self._rng_factory)
                | "GatherTrie" >> beam.combiners.ToList()
                | "TopK" >> beam.FlatMap(_top_k, self._key, self._top_k))


def stage_budget(budget, mechanism):
    """One plan stage per trie level, (epsilon / L, delta / L) each (paper 003 Lemma 4.1)."""
    return _levels.spend_levels(budget, stage_names(mechanism))


def release_stages(records, plan, num_shards, rng_factory=None):
    """Prepared records -> whole users -> at most C distinct keys per user -> distinct-user
    count per key -> TrieHH++ -> top_k. Returns PCollection[Table(key, count, rank)]."""
    from thresher.transforms.aggregate import SumCountsPerKey
    from thresher.transforms.per_user_bound import PerUserBound
    from thresher.transforms.user_shards import ShardByUser
    spec = plan.spec
    keys = list(spec.input.keys)
    bound = spec.bounding.max_keys_per_user
    mech = spec.mechanism
    return (records
            | "ShardByUser" >> ShardByUser(num_shards)
            | "PerUserBound" >> PerUserBound(keys, bound, rng_factory=rng_factory)
            | "SumCountsPerKey" >> SumCountsPerKey(keys, num_shards)             # Table(key, count)
            | "HeavyHitters" >> HeavyHittersRelease(
                keys[0], mech["prefix_lengths"], mech["top_k"], plan.params_by_bound[bound],
                num_shards=num_shards, rng_factory=rng_factory))
