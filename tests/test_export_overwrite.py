"""``export-head --overwrite`` deletes only what an export wrote, and writes through a symlinked folder.

A hostile probe (issue 25, item 9) found that ``--overwrite`` into a folder an earlier export made
deleted a file the user had put there since, and that a symlinked ``--out`` raised ``OSError:
Cannot call rmtree on a symbolic link``. Now a folder holding anything the export did not write is
refused, naming it, with or without ``--overwrite``; a symbolic link to a folder is written
through (what it points to is replaced, the link stays).
"""

from __future__ import annotations

import json

import pytest

from draftwise.eagle.export import CONFIG_FILE, OUTPUT_FILES, WEIGHTS_FILE, check_export_dir, export_speculators
from draftwise.errors import ConfigError
from draftwise.fsutil import MARKER

from .test_head_export import SMOL, _cli, head_folder  # noqa: F401  (head_folder: a fixture)


def _verifier(out) -> str:
    return json.loads((out / CONFIG_FILE).read_text())["speculators_config"]["verifier"]["name_or_path"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_the_user_added_is_named_and_never_deleted(head_folder, tmp_path, overwrite):  # noqa: F811
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL)
    (out / "notes.txt").write_text("mine")
    (out / "extra").mkdir()
    for attempt in (lambda: check_export_dir(out, overwrite=overwrite),
                    lambda: export_speculators(head_folder, out, verifier="org/other", overwrite=overwrite)):
        with pytest.raises(ConfigError, match=r"did not write \(extra, notes\.txt\)") as info:
            attempt()
        assert "--overwrite" not in str(info.value) and "\n" not in str(info.value)  # it would not help
    assert (out / "notes.txt").read_text() == "mine" and (out / "extra").is_dir()
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "extra", "notes.txt", *OUTPUT_FILES])
    assert _verifier(out) == SMOL  # the export itself is untouched too


def test_overwrite_replaces_the_exports_files_and_a_temporary_file_it_left(head_folder, tmp_path):  # noqa: F811
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL)
    (out / f".{WEIGHTS_FILE}.k3x9.tmp").write_bytes(b"half a file")  # a killed export's leftover
    export_speculators(head_folder, out, verifier="org/other", overwrite=True)
    assert _verifier(out) == "org/other"
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, *OUTPUT_FILES])


def test_a_symlinked_folder_is_written_through(head_folder, tmp_path):  # noqa: F811
    real = tmp_path / "disk" / "export"
    real.mkdir(parents=True)
    link = tmp_path / "out"
    link.symlink_to(real, target_is_directory=True)
    export_speculators(head_folder, link, verifier=SMOL)  # a new export through the link
    export_speculators(head_folder, link, verifier="org/other", overwrite=True)  # and over it
    assert link.is_symlink() and _verifier(real) == "org/other"
    assert sorted(p.name for p in real.iterdir()) == sorted([MARKER, *OUTPUT_FILES])
    (real / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"did not write \(notes\.txt\)"):
        export_speculators(head_folder, link, verifier=SMOL, overwrite=True)
    assert (real / "notes.txt").read_text() == "mine"


def test_cli_names_the_foreign_file_in_one_line_before_loading(head_folder, tmp_path):  # noqa: F811
    out = export_speculators(head_folder, tmp_path / "out", verifier=SMOL)
    (out / "notes.txt").write_text("mine")
    # the head names the target "default": a refusal after loading it would take seconds, not this
    res = _cli(str(head_folder), "--out", str(out), "--overwrite")
    assert res.exit_code == 2 and "notes.txt" in res.output and "Traceback" not in res.output
    assert (out / "notes.txt").exists()
