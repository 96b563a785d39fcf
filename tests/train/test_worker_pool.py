"""The worker pool: submit returns at once, poll never blocks, a slow job times out on time without holding
up the others or its slot, exceptions are results, and at most num_workers jobs run at once."""

import threading
import time

import pytest

from barerl.train.worker_pool import WorkerPool


def test_submit_returns_at_once_and_poll_collects_results():
    with WorkerPool(2) as pool:
        start = time.monotonic()
        jobs = [pool.submit(time.sleep, 0.2, key=i) for i in range(2)]
        assert time.monotonic() - start < 0.05 and pool.poll() == []
        done = []
        while len(done) < 2:
            done += pool.wait(timeout=2)
        assert {job.key for job in done} == {0, 1} and all(j.done and j.error is None for j in jobs)


def test_a_slow_job_times_out_while_others_finish():
    release = threading.Event()
    with WorkerPool(2) as pool:
        slow = pool.submit(release.wait, 30, key="slow", timeout=0.3)
        fast = [pool.submit(lambda i=i: i * i, key=i, timeout=5) for i in range(5)]
        finished = {}
        deadline = time.monotonic() + 3
        while len(finished) < 6 and time.monotonic() < deadline:
            finished.update({job.key: job for job in pool.wait(timeout=0.5)})
        assert [finished[i].result for i in range(5)] == [0, 1, 4, 9, 16]
        assert finished["slow"] is slow and slow.timed_out and 0.3 <= slow.seconds < 0.6
        assert pool.num_abandoned == 1  # its thread still runs: Python cannot kill it
        release.set()
        for _ in range(100):
            if pool.num_abandoned == 0:
                break
            time.sleep(0.01)
        assert pool.num_abandoned == 0 and slow.result is None  # its late result was dropped
    assert all(job.done for job in fast)


def test_timeout_counts_from_the_start_not_the_submission():
    with WorkerPool(1) as pool:
        first = pool.submit(time.sleep, 0.3, timeout=1)
        second = pool.submit(time.sleep, 0.1, timeout=0.25)  # queued 0.3 s behind the first
        jobs = pool.run_all([(time.sleep, (0.01,))])  # waits only for its own job
        while not (first.done and second.done):
            time.sleep(0.01)
        assert not first.timed_out and not second.timed_out and jobs[0].done


def test_exceptions_are_results():
    def boom():
        raise KeyError("nope")

    with WorkerPool(1) as pool:
        (job,) = pool.run_all([(boom, ())])
        assert isinstance(job.error, KeyError) and job.result is None and not job.timed_out


def test_at_most_num_workers_run_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def work():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    with WorkerPool(3) as pool:
        pool.run_all([(work, ())] * 12)
    assert peak[0] == 3


def test_run_all_keeps_order_and_does_not_report_to_poll():
    with WorkerPool(4) as pool:
        jobs = pool.run_all([(lambda x: x + 1, (i,)) for i in range(8)], timeout=5)
        assert [j.result for j in jobs] == list(range(1, 9)) and pool.poll() == []


def test_closed_pool_refuses_jobs():
    pool = WorkerPool(1)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(print)
    with pytest.raises(ValueError, match="num_workers"):
        WorkerPool(0)
