"""Vocabulary-sharded (tensor-parallel) Markov chain: rank k owns W2 rows [k V / world, (k+1) V / world).

Modules: ``partition`` (the split rule), ``step`` (one step on one shard), ``keys`` (the packed
(key, global id) word), ``transport`` (how ranks exchange it), ``verify`` (softmax quantities from
a sharded cache), ``sampler`` (:class:`ShardedMarkovSampler`, composing them).
"""

from .partition import all_shard_bounds, max_shard_width, shard_bounds
from .sampler import CACHE_LAYOUTS, ShardedMarkovSampler
from .transport import TRANSPORTS
from .verify import ShardedSoftmaxStats, sharded_softmax_stats, sharded_token_probability

__all__ = [
    "CACHE_LAYOUTS",
    "ShardedMarkovSampler",
    "ShardedSoftmaxStats",
    "TRANSPORTS",
    "all_shard_bounds",
    "max_shard_width",
    "shard_bounds",
    "sharded_softmax_stats",
    "sharded_token_probability",
]
