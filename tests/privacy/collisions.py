"""Ids that collide under the public 64-bit hash of transforms/randomness/hashing.py (test helper).

The polynomial hash sum_k b_k P**k mod 2**64 of a length-2048 Thue-Morse word over
{a, b} equals its complement's for any odd base P (the Prouhet-Tarry-Escott property
of the Thue-Morse sequence kills every power of 2 up to 2**64), and stays equal under a
common prefix; the length is the same, so the finished hashes are equal too. Such pairs
were what made the old user keying re-encode a shard by rank (issue 25, F1)."""
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness.hashing import hash_array
from thresher.transforms.bounding.user_shards import user_shard_of

_TM = "".join("ab"[bin(i).count("1") % 2] for i in range(2048))
_TM_COMPLEMENT = _TM.translate(str.maketrans("ab", "ba"))


def colliding_pair(tag):
    """Two different ids with equal public hashes (``tag`` makes the pair unique)."""
    return f"{tag}:{_TM}", f"{tag}:{_TM_COMPLEMENT}"


def public_shard(ids, num_shards):
    """The user shard each id had under the old keying (the public hash's top bits)."""
    return user_shard_of(hash_array(pa.array(ids)), num_shards)


def pairs_covering_shards(shard_counts, prefix="p"):
    """Colliding pairs, in tag order, until every shard of every count in
    ``shard_counts`` holds at least one pair under the public hash (so that, under the
    old keying, every user shard was re-encoded by rank)."""
    pairs, missing = [], {n: set(range(n)) for n in shard_counts}
    tag = 0
    while any(missing.values()):
        pair = colliding_pair(f"{prefix}{tag}")
        shards = {n: int(public_shard([pair[0]], n)[0]) for n in shard_counts}
        if any(shards[n] in missing[n] for n in shard_counts):
            pairs.append(pair)
            for n in shard_counts:
                missing[n].discard(shards[n])
        tag += 1
    assert all(len(np.unique([public_shard([a], n)[0] for a, _ in pairs])) == n
               for n in shard_counts)
    return pairs
