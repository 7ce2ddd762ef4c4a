"""The end-to-end demo: speculative decoding of a synthetic language with and without the Markov head.

:mod:`.generate` holds the language, the fitted heads, the functional engine and the statistics;
:mod:`.step_engine` the same decoding driven through :class:`~dspark_markov.DSparkStep`;
:mod:`.cli` the command line (:func:`main`).
"""

from .cli import main

__all__ = ["main"]
