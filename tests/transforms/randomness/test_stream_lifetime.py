"""A batch's keyed row streams are freed when the batch is done (issue 34, item 3).

Row streams hold a few words per row (``transforms.randomness.keyed_random.RowStreams``). A view
stored on its streams made a reference cycle, so every batch's streams waited for a
full garbage collection, which numpy-heavy code rarely triggers: peak RSS of a 3e7-row
release grew with the input (python heap 139 MB at 1e7 rows, 320 MB at 3e7, in the
bounding stage). Checked with the collector off: after bounding a shard and
pre-reducing a batch, no row stream is alive. Deterministic.
"""
import gc
import weakref

import numpy as np
import pyarrow as pa

from thresher.pipelines.dataio import io as pio
from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.bounding.prereduce import prereduce_l0
from thresher.transforms.randomness.user_identity import TEST_KEY
from thresher.transforms.bounding.user_shards import exact_users


def _shard():
    rng = np.random.default_rng(3)
    users = [f"u{u}" for u in rng.integers(0, 300, size=4000)]
    words = [f"w{w}" for w in rng.integers(0, 500, size=4000)]
    prepared, _ = pio.prepare_batch(pa.table({"user_id": users, "word": words}), "user_id",
                                    ["word"], identity_key=TEST_KEY)
    return exact_users(prepared)


def test_row_streams_die_with_their_batch(monkeypatch):
    made = []
    init = keyed_random.RowStreams.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(keyed_random.RowStreams, "__init__", recording)
    source = keyed_random.StageSource(keyed_random.KeyedSource(b"s" * 32), "S/PerUserBound")
    table = _shard()
    gc.collect()
    gc.disable()
    try:
        kept = bound_table_l0(table, ["word"], 3, source)
        reduced = prereduce_l0(table, ["word"], 3, source)
        assert len(kept) and len(reduced) and len(made) >= 2
        assert [ref for ref in made if ref() is not None] == []
    finally:
        gc.enable()
