"""The vocabulary-sharded chain on CPU: 2 and 4 gloo processes against the single-process reference.

Each test spawns one process per rank (``torch.multiprocessing``, gloo, a ``file://`` rendezvous in
a temporary directory) and runs a whole scenario of checks in them (``sharded_worker.py``), so the
spawn cost is paid once per scenario. Joins have a deadline: a hang fails the test instead of CI.
The single-process checks at the end need no process group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dspark_markov.draft.reference import argmax_first
from dspark_markov.sharded import all_shard_bounds, max_shard_width, shard_bounds
from dspark_markov.sharded.keys import pack_keys, unpack_key, unpack_token, winner_token

from tests.helpers import spawn_ranks
from tests.sharded import worker as sharded_worker

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

JOIN_DEADLINE_S = 240


def spawn(tmp_path, world, scenarios, vocabs=(301,)):
    spawn_ranks(tmp_path, world, sharded_worker.worker,
                lambda init_file, done_dir: (world, init_file, scenarios, done_dir, vocabs),
                deadline_s=JOIN_DEADLINE_S, label=str(scenarios))


def test_two_ranks_draws_caches_probability_fallbacks(tmp_path):
    """world 2: V = 301 (odd) and 512; fp32/bf16; both layouts; q(x); special rows; set-up agreement."""
    spawn(tmp_path, 2, ["main", "special", "setup"], vocabs=(301, 512))


def test_four_ranks_uneven_shards(tmp_path):
    """world 4: V = 301 = 75 + 75 + 75 + 76; the same checks."""
    spawn(tmp_path, 4, ["main", "special", "setup"], vocabs=(301,))


def test_extreme_values_two_and_three_ranks(tmp_path):
    """Subnormal / fp32-max / mixed-greedy temperatures, inf / NaN / all -inf rows and shards, int64-end seeds and
    positions, padding, empty batches: the reference's draws and cache, V = 301 and 10, world 2 and 3 (uneven)."""
    for world in (2, 3):
        (tmp_path / f"w{world}").mkdir()
        spawn(tmp_path / f"w{world}", world, ["extremes"])


def test_overlapping_logits_cache_is_rejected_on_every_rank(tmp_path):
    spawn(tmp_path, 2, ["cache_overlap"])


# --------------------------------------------------------------------------- no process group needed
@pytest.mark.parametrize("vocab,world", [(301, 2), (301, 4), (129280, 8), (7, 7), (10, 3)])
def test_shard_bounds_partition_the_vocabulary(vocab, world):
    bounds = all_shard_bounds(vocab, world)
    assert bounds[0][0] == 0 and bounds[-1][1] == vocab
    assert all(bounds[k][1] == bounds[k + 1][0] for k in range(world - 1))
    widths = [end - start for start, end in bounds]
    assert min(widths) >= 1 and max(widths) - min(widths) <= 1 and max(widths) == max_shard_width(vocab, world)


def test_shard_bounds_reject_bad_arguments():
    with pytest.raises(ValueError, match="vocab"):
        shard_bounds(3, 4, 0)
    with pytest.raises(ValueError, match="rank"):
        shard_bounds(10, 2, 2)
    with pytest.raises(ValueError, match="world"):
        shard_bounds(10, 0, 0)


def test_packed_words_order_like_argmax():
    """The max over packed (key, id) words is torch.argmax of the keys, for random and special rows."""
    gen = torch.Generator().manual_seed(0)
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3.4e38])
    keys = specials[torch.randint(0, len(specials), (4000, 12), generator=gen)]
    keys[:1000] = torch.randn(1000, 12, generator=gen).round()  # many exact ties
    keys[1000:1010] = float("-inf")
    ids = torch.arange(12).expand_as(keys)
    packed = pack_keys(keys.reshape(-1), ids.reshape(-1)).view_as(keys)
    assert torch.equal(unpack_token(packed.amax(dim=1)), argmax_first(keys))
    assert torch.equal(winner_token(packed.t()), argmax_first(keys))
    finite = torch.isfinite(keys) | torch.isinf(keys)
    assert torch.equal(unpack_key(packed)[finite], (keys + 0.0)[finite])
    assert bool(torch.isnan(unpack_key(packed)[torch.isnan(keys)]).all())


def test_package_imports_without_distributed_initialised():
    import dspark_markov.sharded as sharded

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        sharded.ShardedMarkovSampler(torch.zeros(4, 2), torch.zeros(4, 2), None, 1, 1)
