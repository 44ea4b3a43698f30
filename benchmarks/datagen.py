"""Synthetic data for the quickstart example and the benchmarks.

Rows are (user_id, word) pairs, as in a log of the words users typed:
- users' activity is heavy-tailed: user u's record count is drawn from a Zipf-like
  (discrete Pareto) law, so a few users have thousands of rows and most have a handful;
- words are drawn from a Zipf(``zipf_a``) law over a vocabulary of ``vocabulary`` pronounceable
  pseudo-words (syllable strings), so a few keys are very common and most are rare;
- user ids are strings ``u<number>``, as identifiers usually are;
- on request (``value_column``), a float value per row: lognormal(4, 1) (median e^4 ~ 55,
  rank 0.99 ~ 560, like latencies in ms), the input of ``mechanism.kind: quantiles`` and
  the aggregates. It is drawn from its own stream (:func:`values`), so asking for it
  changes no byte of the user and word columns, and not asking for it leaves the data of
  every earlier benchmark exactly as it was.

Everything is a deterministic function of ``seed`` (numpy PCG64) so a benchmark can be
reproduced exactly; this is test data, not a source of privacy randomness.
"""
import argparse
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "po", "ha", "gu",
              "be", "di", "fa", "jo", "qu", "wi", "xe", "yo", "an", "el", "is", "or"]


def vocabulary(size, seed=0):
    """``size`` distinct pseudo-words, most frequent first."""
    rng = np.random.default_rng(seed)
    words, seen = [], set()
    length = 2
    while len(words) < size:
        batch = rng.integers(0, len(_SYLLABLES), size=(size, length))
        for row in batch:
            w = "".join(_SYLLABLES[i] for i in row)
            if w not in seen:
                seen.add(w)
                words.append(w)
                if len(words) == size:
                    break
        length += 1
    return words


VALUE_STREAM = 1   # values(rows, seed) draws from default_rng([seed, VALUE_STREAM])


def values(rows, seed=0):
    """``rows`` float64 values, lognormal(4, 1), a function of ``seed`` only (its own
    numpy stream: the user and word draws of :func:`generate` are untouched)."""
    return np.random.default_rng([seed, VALUE_STREAM]).lognormal(4.0, 1.0, rows)


def generate(rows, *, users, vocabulary_size, zipf_a=1.1, user_tail=0.8, seed=0,
             value_column=None):
    """A table of ``rows`` (user_id, word) records, and the column ``value_column`` of
    :func:`values` when one is named; see the module docstring."""
    rng = np.random.default_rng(seed)
    # user activity weights ~ rank^-user_tail: heavy-tailed records per user
    weights = 1.0 / np.arange(1, users + 1) ** user_tail
    weights = 0.3 / users + weights / weights.sum()
    weights /= weights.sum()
    user_index = rng.choice(users, size=rows, p=weights)
    user_ids = rng.permutation(users)[user_index]  # so ids do not reveal activity rank
    # words: bounded Zipf over the vocabulary
    ranks = np.arange(1, vocabulary_size + 1, dtype=np.float64)
    p = ranks ** -zipf_a
    p /= p.sum()
    word_index = rng.choice(vocabulary_size, size=rows, p=p)
    words = np.array(vocabulary(vocabulary_size, seed), dtype=object)
    user_strings = pa.array(np.char.add("u", user_ids.astype(str)).astype(object), type=pa.string())
    word_dict = pa.DictionaryArray.from_arrays(pa.array(word_index.astype(np.int32)), pa.array(words))
    table = pa.table({"user_id": user_strings, "word": word_dict.cast(pa.string())})
    return with_values(table, value_column, seed) if value_column else table


def with_values(table, value_column, seed=0):
    """``table`` with the column ``value_column`` of :func:`values` appended (what
    :func:`generate` gives with ``value_column``, from a table it gave without)."""
    return table.append_column(value_column, pa.array(values(table.num_rows, seed)))


def write_parts(folder, rows, parts, *, zipf_a=1.1, user_tail=0.8, seed=0,
                row_group_size=100_000):
    """``rows`` records of :func:`generate`'s law (users = vocabulary = rows / 10) written as
    ``parts`` Parquet files in ``folder``, one part in memory at a time: 1e8 rows in one
    table would take ~15 GB of Python strings. Each part draws from its own seeded stream
    (``seed``, part); the users' weights, their id permutation and the vocabulary are shared."""
    users = vocabulary_size = max(1, rows // 10)
    base = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, users + 1) ** user_tail
    weights = 0.3 / users + weights / weights.sum()
    user_cdf = np.cumsum(weights / weights.sum())
    permutation = base.permutation(users)
    word_p = np.arange(1, vocabulary_size + 1, dtype=np.float64) ** -zipf_a
    word_cdf = np.cumsum(word_p / word_p.sum())
    words = pa.array(vocabulary(vocabulary_size, seed))
    os.makedirs(folder, exist_ok=True)
    for part in range(parts):
        rng = np.random.default_rng([seed, part])
        n = rows // parts + (part < rows % parts)
        user_ids = permutation[np.minimum(np.searchsorted(user_cdf, rng.random(n)), users - 1)]
        word_index = np.minimum(np.searchsorted(word_cdf, rng.random(n)), vocabulary_size - 1)
        user_strings = pa.array(np.char.add("u", user_ids.astype(str)).astype(object),
                                type=pa.string())
        word_dict = pa.DictionaryArray.from_arrays(pa.array(word_index.astype(np.int32)), words)
        table = pa.table({"user_id": user_strings, "word": word_dict.cast(pa.string())})
        write(table, os.path.join(folder, f"part-{part:04d}.parquet"), row_group_size)
        del table, user_strings, word_dict


def write(table, path, row_group_size=100_000):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size, compression="zstd")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--vocabulary", type=int, default=50_000)
    parser.add_argument("--zipf-a", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--value-column", default=None,
                        help="also write a lognormal(4, 1) float column of this name "
                             "(its own seeded stream: the other columns are unchanged)")
    args = parser.parse_args()
    table = generate(args.rows, users=args.users, vocabulary_size=args.vocabulary,
                     zipf_a=args.zipf_a, seed=args.seed, value_column=args.value_column)
    write(table, args.output)
    print(f"wrote {table.num_rows} rows to {args.output} ({os.path.getsize(args.output)} bytes)")


if __name__ == "__main__":
    main()
