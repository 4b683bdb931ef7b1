"""The runners of ``tfrfs.jobs.runner`` (SPEC 8): results in job order, a job's own exception raised in
the caller, and a pool worker killed mid-job: its jobs run again and the results are the same."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from support import jobdata
from tfrfs.jobs import runner as jobs


@pytest.mark.parametrize("make", [jobs.InProcess, lambda: jobs.LocalPool(2)], ids=["in-process", "pool"])
def test_results_in_job_order(make) -> None:
    with make() as runner:
        assert list(runner.ordered(jobdata.square, [(n,) for n in range(40)])) == [n * n for n in range(40)]
        assert sorted(runner.run(jobdata.square, [(n,) for n in range(10)])) == [(n, n * n) for n in range(10)]


@pytest.mark.parametrize("make", [jobs.InProcess, lambda: jobs.LocalPool(2)], ids=["in-process", "pool"])
def test_a_job_that_raises_raises_in_the_caller(make) -> None:
    with make() as runner, pytest.raises(LookupError, match="shard 7 is gone"):
        list(runner.ordered(jobdata.fail, [("shard 7 is gone",)]))


def test_runner_of_the_options() -> None:
    assert isinstance(jobs.runner(workers=1), jobs.InProcess)
    assert isinstance(jobs.runner(workers=3), jobs.LocalPool)


def test_a_killed_pool_worker_reruns_its_jobs(tmp_path: Path) -> None:
    marks = tmp_path / "pids"
    marks.mkdir()
    killed: list[int | None] = []
    killer = threading.Thread(target=lambda: killed.append(jobdata.kill_first(marks)))
    todo = [(n, str(marks), 0.3) for n in range(8)]
    with jobs.LocalPool(2) as runner:
        killer.start()
        got = list(runner.ordered(jobdata.slow_square, todo))
    killer.join()
    assert killed and killed[0] is not None
    assert got == [n * n for n in range(8)]
    # Some job ran more than once: once in the killed worker, again in a fresh one.
    ran = [p.name.split("-")[1] for p in marks.iterdir()]
    assert len(ran) > len(set(ran))


def test_a_worker_killed_between_jobs_fails_nothing(tmp_path: Path) -> None:
    """Workers killed while idle, between two jobs: the pool notices before the next job goes in,
    and ``submit`` itself raises BrokenProcessPool. That job, and those the pool held, run again."""
    import os
    import signal
    import time
    marks = tmp_path / "pids"
    marks.mkdir()
    todo = [(n, str(marks), 0.0) for n in range(12)]
    with jobs.LocalPool(2) as runner:
        results = runner.run(jobdata.slow_square, todo)
        got = [next(results)]
        pool = runner._pool
        for pid in {int(p.read_text()) for p in marks.iterdir()}:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not getattr(pool, "_broken", False) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert getattr(pool, "_broken", False), "the pool did not notice its workers were killed"
        got += list(results)
    assert sorted(got) == [(n, n * n) for n in range(12)]


def test_pool_workers_see_the_environment_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork server started before a variable was set (a store's credentials) must not hide it."""
    import multiprocessing
    import os
    ctx = multiprocessing.get_context("forkserver")
    with ctx.Pool(1) as early:                      # the fork server starts now, without the variable
        assert early.apply(os.getenv, ("TFRFS_TEST_CREDENTIAL",)) is None
    monkeypatch.setenv("TFRFS_TEST_CREDENTIAL", "secret")
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait)       # a second thread: the pool starts by the fork server
    busy.start()
    try:
        with jobs.LocalPool(2) as pool:
            got = list(pool.ordered(os.getenv, [("TFRFS_TEST_CREDENTIAL",)] * 4))
    finally:
        stop.set()
        busy.join()
    assert got == ["secret"] * 4
