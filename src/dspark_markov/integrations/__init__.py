"""Integrations of the draft sampler into serving engines.

- :mod:`.vllm`: a vLLM general plugin giving vLLM's NVIDIA DSpark draft models a
  ``sample_sequential`` hook (off unless ``DSPARK_MARKOV_VLLM=1``; see the README).

Nothing here is imported by ``import dspark_markov``; the engine imports it through its plugin
entry point.
"""
