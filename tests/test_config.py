"""pagedattn.config: every PAGEDATTN_* name the code reads is declared there, each is validated
when read, and docs/configuration.md holds the same table."""
import os
import re

import pytest

from pagedattn import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# where code reads variables: the package, the tests, the scripts, the build and CI files
SOURCES = ["pagedattn", "tests", "scripts", "bench", "Makefile", ".ci", "examples", "docker",
           ".github"]


def _names_in_tree():
    found = {}
    for src in SOURCES:
        top = os.path.join(ROOT, src)
        paths = [top] if os.path.isfile(top) else [
            os.path.join(d, f) for d, _, files in os.walk(top) for f in files
            if not f.endswith((".pyc", ".so", ".o"))]
        for p in paths:
            try:
                text = open(p, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for name in re.findall(r"PAGEDATTN_[A-Z0-9_]*[A-Z0-9]", text):
                found.setdefault(name, os.path.relpath(p, ROOT))
    return found


def test_every_name_in_the_tree_is_declared():
    prefixes = (config.PREFIX.rstrip("_"), config.DEV_PREFIX.rstrip("_"))
    undeclared = {n: p for n, p in _names_in_tree().items()
                  if n not in config.DECLARED and n not in prefixes
                  and p != os.path.join("tests", "test_config.py")}
    assert not undeclared, f"read but not declared in pagedattn/config.py: {undeclared}"


def test_at_most_twelve_variables():
    assert len(config.DECLARED) <= 12
    public = [n for n in config.DECLARED if not n.startswith(config.DEV_PREFIX)]
    assert all(n.startswith(config.PREFIX) for n in config.DECLARED) and public


def test_docs_table_matches_the_module():
    text = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    assert config.markdown_table() in text


@pytest.mark.parametrize("name,bad", [("PAGEDATTN_BACKEND", "cuda"), ("PAGEDATTN_VALIDATE", "yes"),
                                      ("PAGEDATTN_PARTITION_SIZE", "0"),
                                      ("PAGEDATTN_PARTITION_SIZE", "big"),
                                      ("PAGEDATTN_DEV_DECODE_MODE", "spread"),
                                      ("PAGEDATTN_LAUNCH_REPLAY", "on")])
def test_bad_values_raise_naming_the_variable(monkeypatch, name, bad):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=name):
        config.get(name)


def test_values_parse_and_defaults(monkeypatch):
    for name in config.DECLARED:
        monkeypatch.delenv(name, raising=False)
    assert config.get("PAGEDATTN_BACKEND") == "auto"
    assert config.get("PAGEDATTN_PARTITION_SIZE") is None
    assert config.get("PAGEDATTN_VALIDATE") is False
    assert config.get("PAGEDATTN_LAUNCH_REPLAY") is True
    monkeypatch.setenv("PAGEDATTN_PARTITION_SIZE", "256")
    assert config.get("PAGEDATTN_PARTITION_SIZE") == 256
    monkeypatch.setenv("PAGEDATTN_VALIDATE", "1")
    assert config.get("PAGEDATTN_VALIDATE") is True
    with pytest.raises(KeyError):
        config.get("PAGEDATTN_NOT_A_VARIABLE")


def test_validate_all_rejects_undeclared_names(monkeypatch):
    for name in [n for n in os.environ if n.startswith(config.PREFIX)]:
        monkeypatch.delenv(name)
    config.validate_all()
    monkeypatch.setenv("PAGEDATTN_DECODE_FOLD", "last")
    with pytest.raises(ValueError, match="PAGEDATTN_DECODE_FOLD"):
        config.validate_all()


def test_override_restores(monkeypatch):
    monkeypatch.delenv("PAGEDATTN_DEV_DECODE_MODE", raising=False)
    restore = config.override("PAGEDATTN_DEV_DECODE_MODE", "split")
    assert config.get("PAGEDATTN_DEV_DECODE_MODE") == "split"
    restore()
    assert not config.is_set("PAGEDATTN_DEV_DECODE_MODE")


@pytest.mark.parametrize("module,argv", [("pagedattn.dispatch.__main__", []),
                                         ("pagedattn.selfcheck.__main__", ["--device", "cpu"])])
def test_entry_points_reject_misspelled_names(monkeypatch, capsys, module, argv):
    """The documented promise: both commands run validate_all and stop, naming the typo."""
    import importlib
    monkeypatch.setenv("PAGEDATTN_BACKNED", "torch")
    main = importlib.import_module(module).main
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "PAGEDATTN_BACKNED" in err and "not a pagedattn variable" in err


def test_partition_size_from_the_environment_names_the_variable(monkeypatch):
    """The rule docs/configuration.md states (a power of 2), and the error names where the bad
    value came from: the variable, or the argument."""
    import torch

    import pagedattn as pa
    assert "power of 2" in config.DECLARED["PAGEDATTN_PARTITION_SIZE"].meaning
    k, v = pa.make_kv_cache(4, 16, 1, 64, dtype=torch.float32)
    args = (torch.randn(1, 2, 64), k.zero_(), v.zero_(), torch.zeros(1, 1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32))
    monkeypatch.setenv("PAGEDATTN_PARTITION_SIZE", "48")
    with pytest.raises(ValueError, match="PAGEDATTN_PARTITION_SIZE: expected a positive power "
                                         "of 2, got 48"):
        pa.paged_decode(*args, backend="torch")
    monkeypatch.setenv("PAGEDATTN_PARTITION_SIZE", "64")
    with pytest.raises(ValueError, match="^partition_size: expected a positive power of 2"):
        pa.paged_decode(*args, backend="torch", partition_size=48)
    assert pa.paged_decode(*args, backend="torch").shape == (1, 2, 64)


def test_every_cache_lives_under_the_cache_dir(monkeypatch, tmp_path):
    """PAGEDATTN_CACHE_DIR moves every download and build, the tests' peer wheels included
    (they went to ~/.cache whatever it said)."""
    import compat_peers

    from pagedattn.bench import _sglang_peer
    monkeypatch.setenv("PAGEDATTN_CACHE_DIR", str(tmp_path))
    assert config.cache_dir() == str(tmp_path)
    assert compat_peers.cache_dir() == str(tmp_path / "peer_wheels")
    assert _sglang_peer.cache_root() == str(tmp_path / "sglang-peer")
