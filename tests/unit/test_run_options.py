"""``--ray [ADDRESS]`` and ``--workers N`` (SPEC 8) as the command line reads them."""

from __future__ import annotations

import pytest

from conftest import run_tfrfs
from tfrfs.cli.parser import _bare_ray, build_parser


def parse(*argv: str):
    return build_parser().parse_args(_bare_ray(list(argv)))


@pytest.mark.parametrize("argv", [("verify", "--ray", "/data"), ("verify", "/data", "--ray"),
                                  ("verify", "--ray=auto", "/data"), ("verify", "--ray", "s3://b/p"),
                                  ("reshard", "--ray", "/data", "/out", "--shards", "2")])
def test_a_bare_ray_is_auto_and_leaves_the_source_alone(argv):
    args = parse(*argv)
    assert args.ray == "auto"
    assert args.source in ("/data", "s3://b/p")


@pytest.mark.parametrize("address", ["10.0.0.1:6379", "head-node.local:6379", "ray://head:10001", "auto",
                                     "[fe80::1]:6379"])
def test_an_address_after_ray_is_the_address(address):
    args = parse("verify", "--ray", address, "/data")
    assert args.ray == address and args.source == "/data"


def test_without_ray_there_is_no_cluster():
    assert parse("index", "/data").ray is None


def test_workers_below_one_is_a_usage_error(tmp_path):
    proc = run_tfrfs("verify", str(tmp_path), "--workers", "0")
    assert proc.returncode == 2
    assert "--workers" in proc.stderr and "Traceback" not in proc.stderr
