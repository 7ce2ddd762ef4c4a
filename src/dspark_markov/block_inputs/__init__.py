"""Block inputs of a DSpark step (the anchor row and the N mask rows per request): reference and Triton."""

from .api import prepare_block_inputs, prepare_block_inputs_reference

__all__ = ["prepare_block_inputs", "prepare_block_inputs_reference"]
