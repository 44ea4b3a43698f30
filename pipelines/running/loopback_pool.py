"""Beam's worker pool for ``--workers N`` on this machine, listening on localhost only.

Beam's ``worker_pool_main`` binds its service on every interface (``[::]:PORT``) and has
no flag for the address; the pool thresher starts for local workers serves only the
engine on this machine, so it binds ``localhost`` (127.0.0.1 and ::1) through the same
wrapper as the launcher's LOOPBACK worker service (``engines.loopback_worker_service``),
then runs Beam's pool unchanged: ``python -m thresher.pipelines.running.loopback_pool
--service_port=PORT``.
"""
import sys

from thresher.pipelines.running.engines import loopback_worker_service


def main(argv=None):
    loopback_worker_service()
    from apache_beam.runners.worker import worker_pool_main  # heavy: apache_beam
    worker_pool_main.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
