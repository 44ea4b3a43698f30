"""The per-user row count behind the heavy-user refusal (transforms/bounding/user_shards.py,
``check_user_rows``; issue 34). Users are (word 0, word 1) pairs: two users sharing
word 0 are counted apart (a count per word 0 would refuse two ordinary users); counts
add up across pieces, in memory or spilled to files. Deterministic."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.errors import InputError
from thresher.transforms.plumbing import spill
from thresher.transforms.bounding.user_shards import check_user_rows, user_row_counts


def _piece(pairs):
    """A shuffle piece: rows of the given (word 0, word 1, rows) users."""
    high = np.concatenate([np.full(n, h, dtype=np.uint64) for h, _, n in pairs])
    low = np.concatenate([np.full(n, lo, dtype=np.uint64) for _, lo, n in pairs])
    return pa.table({"__user": high, "__user_lo": low, "word": pa.array(["w"] * len(high))})


@pytest.mark.parametrize("spilled", [False, True])
def test_rows_are_counted_per_user_across_pieces(tmp_path, spilled):
    pieces = [_piece([(7, 1, 200), (9, 3, 40)]), _piece([(7, 2, 200), (9, 3, 100)])]
    if spilled:
        pieces = [spill.write_piece(p, str(tmp_path)) for p in pieces]
    assert user_row_counts(pieces) == (200, 7)     # (7, 1) and (7, 2) are two users
    check_user_rows(pieces, 200, ("bounding.model", "use l0"))   # nobody above 200
    pieces.append(_piece([(9, 3, 61)]) if not spilled else
                  spill.write_piece(_piece([(9, 3, 61)]), str(tmp_path)))
    with pytest.raises(InputError, match=r"bounding.model: a user has more than 200 rows.*"
                                         r"use l0") as refused:
        check_user_rows(pieces, 200, ("bounding.model", "use l0"))
    assert "201" not in str(refused.value)       # the user's own count is never said (F3)
