"""dspark-markov: DSpark's sequential Markov draft sampling, exact and fast.

Importing the package needs only torch; Triton is imported when a Triton implementation is used.
"""

from .draft.api import sample_drafts
from .draft.sampler import DraftOutput, MarkovSampler
from .head import MarkovHead
from .rng import (
    DRAFT_POS_SALT,
    GOLDEN_DOMAIN,
    draft_key_pos,
    draft_noise,
    draft_step_seed,
    gumbel32,
    gumbel64,
    inverse_cdf_uniform,
    murmur3_hash32,
    uniform32,
    uniform64,
)
from .verify import VerifyOutput, verify_drafts

__version__ = "0.1.0"

__all__ = [
    "DRAFT_POS_SALT",
    "GOLDEN_DOMAIN",
    "DraftOutput",
    "MarkovHead",
    "MarkovSampler",
    "VerifyOutput",
    "__version__",
    "draft_key_pos",
    "draft_noise",
    "draft_step_seed",
    "gumbel32",
    "gumbel64",
    "inverse_cdf_uniform",
    "murmur3_hash32",
    "sample_drafts",
    "uniform32",
    "uniform64",
    "verify_drafts",
]
