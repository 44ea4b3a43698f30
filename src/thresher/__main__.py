"""``python -m thresher`` is the ``thresher`` command."""
from thresher.pipelines.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
