"""Key selection and release: which keys are published, with what noise.

The release DoFn every release kernel runs in (``release_fn``), thresholded Gaussian /
Laplace release (``noisy_threshold``), sample-and-threshold (``sample_and_threshold``,
``sanitize_sample``), weighted and adaptive partition selection (``weighted_threshold``,
``adaptive_rounds``), release over a public key domain (``public_domain``) and the
count of unique keys (``unique_keys``).

May import ``transforms.plumbing``, ``transforms.randomness`` and ``transforms.bounding``;
never values or trees.
"""
