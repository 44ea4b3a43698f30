"""--overwrite replaces thresher's own files only, and a symlinked output folder is
followed, not replaced (issue 16, CLI habits)."""
import json
import os

from tests.robustness.conftest import run_cli, words_table, write_parquet, write_spec


def _release(tmp_path):
    data = write_parquet(tmp_path / "d.parquet", words_table(n_users=500))
    spec, out = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec)
    assert code == 0, err
    return spec, out


def test_overwrite_keeps_the_users_own_files(tmp_path):
    spec, out = _release(tmp_path)
    with open(os.path.join(out, "notes.txt"), "w", encoding="utf-8") as handle:
        handle.write("my notes")
    os.makedirs(os.path.join(out, "plots"))
    open(os.path.join(out, "plots", "a.png"), "wb").close()
    code, _, err = run_cli("run", spec, "--overwrite")
    assert code == 0, err
    assert sorted(os.listdir(out)) == ["notes.txt", "plots", "release_report.json",
                                       "released.parquet"]
    with open(os.path.join(out, "notes.txt"), encoding="utf-8") as handle:
        assert handle.read() == "my notes"
    assert os.listdir(os.path.join(out, "plots")) == ["a.png"]
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n or ".old-" in n]


def test_a_symlinked_output_folder_is_followed(tmp_path):
    spec, out = _release(tmp_path)
    target = tmp_path / "elsewhere"
    os.replace(out, target)
    os.symlink(target, out)
    code, _, err = run_cli("run", spec, "--overwrite")
    assert code == 0, err
    assert os.path.islink(out) and os.path.realpath(out) == str(target)
    with open(target / "release_report.json", encoding="utf-8") as handle:
        assert json.load(handle)["outputs"] == ["released.parquet"]
