"""Synthetic data for the quickstart example and the benchmarks.

Rows are (user_id, word) pairs, as in a log of the words users typed:
- users' activity is heavy-tailed: user u's record count is drawn from a Zipf-like
  (discrete Pareto) law, so a few users have thousands of rows and most have a handful;
- words are drawn from a Zipf(``zipf_a``) law over a vocabulary of ``vocabulary`` pronounceable
  pseudo-words (syllable strings), so a few keys are very common and most are rare;
- user ids are strings ``u<number>``, as identifiers usually are.

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


def generate(rows, *, users, vocabulary_size, zipf_a=1.1, user_tail=0.8, seed=0):
    """A table of ``rows`` (user_id, word) records; see the module docstring."""
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
    return pa.table({"user_id": user_strings, "word": word_dict.cast(pa.string())})


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
    args = parser.parse_args()
    table = generate(args.rows, users=args.users, vocabulary_size=args.vocabulary,
                     zipf_a=args.zipf_a, seed=args.seed)
    write(table, args.output)
    print(f"wrote {table.num_rows} rows to {args.output} ({os.path.getsize(args.output)} bytes)")


if __name__ == "__main__":
    main()
