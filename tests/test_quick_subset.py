"""The README's quick test subset (issue 29): `python -m pytest @tests/quick.txt -q` names
test files and tests that exist, none of them slow, and the README says how long the full
suite takes and how to run the subset. Its running time is measured, not asserted (see
the commit that added it)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quick_subset_collects_and_the_readme_names_it():
    with open(os.path.join(ROOT, "tests", "quick.txt"), encoding="utf-8") as handle:
        entries = [line.strip() for line in handle if line.strip()]
    assert entries
    for entry in entries:
        assert os.path.isfile(os.path.join(ROOT, entry.split("::")[0])), entry
    done = subprocess.run([sys.executable, "-m", "pytest", "@tests/quick.txt", "--co", "-q",
                           "-p", "no:cacheprovider"], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(ids) >= 100, done.stdout[-2000:]
    assert all(i.split("::")[0] in {e.split("::")[0] for e in entries} for i in ids)
    slow = subprocess.run([sys.executable, "-m", "pytest", "@tests/quick.txt", "--co", "-q",
                           "-p", "no:cacheprovider", "-m", "slow"], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert "no tests collected" in slow.stdout or not [l for l in slow.stdout.splitlines() if "::" in l]
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    assert "python -m pytest @tests/quick.txt -q" in readme
    assert "about 14 minutes on 2 cores" in readme
