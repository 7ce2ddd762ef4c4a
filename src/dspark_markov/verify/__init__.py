"""Lossless verification of Markov drafts (SPEC.md section 6): reference and keys."""

from .api import VerifyOutput, verify_drafts

__all__ = ["VerifyOutput", "verify_drafts"]
