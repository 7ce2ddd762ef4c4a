"""Issue 14 item 6: ShardedMarkovSampler's per-call checks are agreed across ranks (gloo, 2 processes).

A rank whose call is rejected used to raise alone while its peers waited in the step's collective
until the group timeout; now one all-reduce per call makes every rank raise the same ``ValueError``.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.helpers import spawn_ranks
from tests.sharded import robust_worker as robust_sharded_worker

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

JOIN_DEADLINE_S = 150


def test_item6_a_rejected_call_on_one_rank_raises_on_every_rank(tmp_path):
    world = 2
    spawn_ranks(tmp_path, world, robust_sharded_worker.worker,
                lambda init_file, done_dir: (world, init_file, done_dir), deadline_s=JOIN_DEADLINE_S)


def test_ranks_built_with_different_transport_or_agree_checks_raise_at_construction(tmp_path):
    world = 2
    spawn_ranks(tmp_path, world, robust_sharded_worker.worker,
                lambda init_file, done_dir: (world, init_file, done_dir, ("config",)), deadline_s=JOIN_DEADLINE_S)


def test_fallback_impl_checked_at_construction_and_its_failure_on_one_rank_raises_on_every_rank(tmp_path):
    world = 2
    spawn_ranks(tmp_path, world, robust_sharded_worker.worker,
                lambda init_file, done_dir: (world, init_file, done_dir, ("fallback_impl",)), deadline_s=JOIN_DEADLINE_S)


def test_sharded_softmax_checks_and_row_count_agreed_on_every_rank(tmp_path):
    world = 2
    spawn_ranks(tmp_path, world, robust_sharded_worker.worker,
                lambda init_file, done_dir: (world, init_file, done_dir, ("verify",)), deadline_s=JOIN_DEADLINE_S)
