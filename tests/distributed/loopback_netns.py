"""Run a command in a private network namespace whose only interface is loopback.

    python tests/distributed/loopback_netns.py [--pool PYTHON] [--timeout S] -- CMD ...

Prism's job server listens on every interface (``:PORT`` in Beam's Go code) and Beam's
worker pool on ``[::]:PORT``; neither has a flag for the address. Inside a fresh network
namespace (``unshare -n``, as root; only ``lo``, brought up here) every listener is
reachable from this namespace's loopback only, so nothing a test starts is on a real
interface. With ``--pool PYTHON`` Beam's worker pool (``worker_pool_main``, run by that
interpreter: a virtualenv with thresher installed) is started in the namespace on a free
port first, ``{pool}`` in CMD becomes its ``localhost:PORT``, and it is stopped (its whole
process group) when CMD ends; the last stderr line says how many SDK workers it started.
CMD is bounded by ``--timeout``; the exit code is CMD's (124 past the timeout).
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time

_INSIDE = "_THRESHER_LOOPBACK_NETNS"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop_group(process):
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)
    except ProcessLookupError:
        pass


def _start_pool(python, log_path):
    for _ in range(3):
        port = _free_port()
        log = open(log_path, "w")
        process = subprocess.Popen([python, "-m", "apache_beam.runners.worker.worker_pool_main",
                                    f"--service_port={port}"], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return process, port
            except OSError:
                time.sleep(0.2)
        _stop_group(process)
    raise SystemExit(f"loopback_netns: the worker pool did not start; log {log_path}")


def main(argv):
    if "--" not in argv:
        raise SystemExit(__doc__)
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--pool")
    parser.add_argument("--pool-log", default=None)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if os.environ.get(_INSIDE) != "1":
        env = dict(os.environ, **{_INSIDE: "1"})
        return subprocess.call(["unshare", "-n", sys.executable, os.path.abspath(__file__)]
                               + argv, env=env)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    env = {k: v for k, v in os.environ.items() if k != _INSIDE}
    pool = None
    if args.pool:
        log_path = args.pool_log or os.path.join(os.getcwd(), "worker_pool.log")
        pool, port = _start_pool(args.pool, log_path)
        command = [word.replace("{pool}", f"localhost:{port}") for word in command]
    try:
        child = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            rc = child.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"loopback_netns: {command[0]} did not finish within {args.timeout:g} s",
                  file=sys.stderr)
            rc = 124
        _stop_group(child)      # and whatever it left running (Prism, if Beam did not stop it)
    finally:
        if pool is not None:
            _stop_group(pool)
            with open(log_path, errors="replace") as handle:
                started = handle.read().count("Starting worker with command")
            print(f"loopback_netns: the worker pool started {started} SDK workers",
                  file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
