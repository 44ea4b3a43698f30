"""Randomness: every draw of a release and every secret-keyed identity.

The exact samplers (``samplers``: discrete Gaussian / Laplace from a CSPRNG), the keyed
streams derived from the release secret and a stage's label path, handed to it by the
release (``keyed_random.KeyedDraws``; ``keyed_random``, over
the AES-based PRF of ``block_prf`` in the construction named by ``stream_construction``),
the canonical key hashes and texts (``hashing``), the secret-keyed user identities
(``user_identity``) and the one-secret-per-run commitments (``secret_commitment``).

May import ``transforms.plumbing`` (the column names of ``plumbing.tables``) and
``thresher.accounting`` / ``thresher.errors``; never bounding, selection, values or trees.
"""
