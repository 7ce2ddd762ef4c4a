"""Issue 14 item 6: ShardedMarkovSampler's per-call checks are agreed across ranks (gloo, 2 processes).

A rank whose call is rejected used to raise alone while its peers waited in the step's collective
until the group timeout; now one all-reduce per call makes every rank raise the same ``ValueError``.
"""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.sharded import robust_worker as robust_sharded_worker

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

JOIN_DEADLINE_S = 150


def test_item6_a_rejected_call_on_one_rank_raises_on_every_rank(tmp_path):
    world = 2
    done_dir = tmp_path / "done"
    done_dir.mkdir()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    context = mp.start_processes(robust_sharded_worker.worker, args=(world, str(tmp_path / "rendezvous"), str(done_dir)),
                                 nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + JOIN_DEADLINE_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world}-rank job did not finish within {JOIN_DEADLINE_S} s (a hang)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
    assert sorted(os.listdir(done_dir)) == [f"rank{rank}.ok" for rank in range(world)]
