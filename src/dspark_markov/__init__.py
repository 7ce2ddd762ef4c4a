"""dspark-markov: DSpark's sequential Markov draft sampling, exact and fast.

Importing the package needs only torch; Triton is imported when a Triton implementation is used.
"""

from .block_inputs import prepare_block_inputs
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
from .step import DSparkStep
from .validate import DeviceStatusError
from .verify import VerifyOutput, verify_drafts
from .verify.filtering import top_k_top_p

from ._version import __version__

__all__ = [
    "DRAFT_POS_SALT",
    "DSparkStep",
    "DeviceStatusError",
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
    "prepare_block_inputs",
    "sample_drafts",
    "top_k_top_p",
    "uniform32",
    "uniform64",
    "verify_drafts",
]
