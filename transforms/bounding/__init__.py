"""Per-user contribution bounding: whole users into one element, then at most C keys
(and clamped values) per user.

``user_shards.ShardByUser`` (the user-sharded shuffle), l0 / l-inf bounding
(``per_user_bound``, ``rand_clip``, ``key_value_bound``), the pre-reduction at read time
(``prereduce``), the private choice of the bound (``choose_contribution_bound``) and the
one-pass scored bounding of ``bound: auto`` (``scored_bound``).

May import ``transforms.plumbing`` and ``transforms.randomness``; never selection,
values or trees.
"""
