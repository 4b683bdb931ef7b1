"""SPEC 8 on a two-node Ray cluster: the shard jobs spread over both nodes give what one process
gives (index --beside, verify of a large shard in parts, inspect --json, repair)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support import jobdata


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jobdata.make(tmp_path_factory.mktemp("jobs") / "data")


def test_two_nodes_give_what_one_process_gives(ray_two_nodes, dataset: Path, tmp_path: Path) -> None:
    address = ray_two_nodes.address
    a, b = Path(shutil.copytree(dataset, tmp_path / "a")), Path(shutil.copytree(dataset, tmp_path / "b"))
    one = jobdata.run_on("index", "--beside", "--workers", "1", src=a, cache=tmp_path / "c1")
    assert jobdata.run_on("index", "--beside", "--ray", address, src=b, cache=tmp_path / "c2") == one
    shipped = {k: v for k, v in jobdata.files(a).items() if k.endswith(".tfrfs-idx")}
    assert shipped and shipped == {k: v for k, v in jobdata.files(b).items() if k.endswith(".tfrfs-idx")}
    for args in (("verify",), ("inspect", "--json"), ("repair",)):
        one = jobdata.run_on(*args, "--workers", "1", src=a, cache=tmp_path / "c1")
        assert jobdata.run_on(*args, "--ray", address, src=b, cache=tmp_path / "c2") == one, args
    # The repaired shards are the same (their index files and the manifest name their new times).
    def shards(root: Path) -> dict[str, bytes]:
        return {k: v for k, v in jobdata.files(root).items() if not k.endswith((".tfrfs-idx", ".tfrfs-manifest"))}
    assert shards(a) == shards(b)
