"""The launcher's check of every node's own data (dacflnode/cluster/precheck.py): the first bad
node in node order, named; the images it decodes handed over to the nodes' caches, where their
daemons read them instead of decoding them again."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dacflnode.assembly.data import cache_dir_in, own_node_data
from dacflnode.cluster.precheck import check_own_data, copy_cache
from dacflnode.config import RunConfig
from dacflnode.errors import ConfigError
from dacflnode.learning.owndata import load_local_data
from dacflnode.learning.owndata.images import CACHE_FOLDER


def table_runs(root: Path, files: dict[str, str]) -> dict[str, RunConfig]:
    runs = {}
    for node, text in files.items():
        (root / node).mkdir(parents=True)
        (root / node / "data.csv").write_text(text)
        runs[node] = RunConfig(dataset="table", classes=("a", "b"), label_column="y",
                               nodes=len(files), data_root=str(root / node))
    return runs


GOOD = "x1,x2,y\n1,2,a\n3,4,b\n5,6,a\n"


def test_the_first_bad_node_in_node_order_is_named_with_the_setting(tmp_path):
    runs = table_runs(tmp_path, {"node-0": GOOD, "node-1": GOOD.replace("y\n", "z\n", 1),
                                 "node-2": "x1,x2,y\n1,2,c\n"})
    with pytest.raises(ConfigError) as err:
        check_own_data(runs, tmp_path / "scratch")
    assert err.value.field == "node-1: label_column"
    assert "no label column 'y'" in err.value.message


def test_nodes_with_other_contracts_are_refused(tmp_path):
    runs = table_runs(tmp_path, {"node-0": GOOD, "node-1": GOOD.replace("x2", "x3")})
    with pytest.raises(ConfigError) as err:
        check_own_data(runs, tmp_path / "scratch")
    assert err.value.field == "data_root" and "node-1 has feature names" in err.value.message


def test_good_tables_pass_and_a_built_in_data_set_is_not_read(tmp_path):
    check_own_data(table_runs(tmp_path, {"node-0": GOOD, "node-1": GOOD}), tmp_path / "scratch")
    # fashion-mnist with no files anywhere: nothing to check before the daemons load it
    check_own_data({"node-0": RunConfig(data_root=str(tmp_path / "nowhere"))},
                   tmp_path / "scratch")
    assert not (tmp_path / "scratch").exists()


def test_images_decoded_by_the_check_are_read_from_the_nodes_cache(tmp_path):
    rng = np.random.default_rng(0)
    runs = {}
    for node in ("node-0", "node-1"):
        for c in ("a", "b"):
            folder = tmp_path / "data" / node / c
            folder.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)).save(
                    folder / f"{i}.png")
        runs[node] = RunConfig(dataset="folder", classes=("a", "b"), nodes=2,
                               data_root=str(tmp_path / "data" / node))
    check_own_data(runs, tmp_path / "scratch")
    for node, run in runs.items():
        state = tmp_path / "run" / node
        assert copy_cache(tmp_path / "scratch" / node, cache_dir_in(state)) == 3
        files = list((cache_dir_in(state) / CACHE_FOLDER).iterdir())
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
        # the node's daemon finds the images the check decoded: they are decoded once
        again = load_local_data("folder", run.data_root or "", classes=["a", "b"],
                                cache_dir=cache_dir_in(state))
        assert again.from_cache and again.train_size == 6
        info = own_node_data(run, cache_dir_in(state)).info  # as the node's daemon reads it
        assert info.size + info.test_size == 6


def test_copy_cache_copies_the_key_last_and_skips_torn_writes(tmp_path, monkeypatch):
    source = tmp_path / "a" / CACHE_FOLDER
    source.mkdir(parents=True)
    for name in ("folder-1.json", "folder-1.x.npy", "folder-1.y.npy", "folder-2.x.npy.tmp"):
        (source / name).write_text(name)
    order: list[str] = []

    def no_links(src: Path, dst: Path) -> None:
        order.append(Path(dst).name)
        raise OSError("another file system")

    monkeypatch.setattr("os.link", no_links)
    assert copy_cache(tmp_path / "a", tmp_path / "b") == 3
    assert order == ["folder-1.x.npy", "folder-1.y.npy", "folder-1.json"]
    copied = sorted(p.name for p in (tmp_path / "b" / CACHE_FOLDER).iterdir())
    assert copied == ["folder-1.json", "folder-1.x.npy", "folder-1.y.npy"]
    assert (tmp_path / "b" / CACHE_FOLDER / "folder-1.json").read_text() == "folder-1.json"
    assert stat.S_IMODE((tmp_path / "b" / CACHE_FOLDER / "folder-1.json").stat().st_mode) \
        == 0o600
    assert copy_cache(tmp_path / "nothing", tmp_path / "c") == 0
    assert not (tmp_path / "c").exists()
