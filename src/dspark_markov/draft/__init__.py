"""Sequential Markov draft sampling: reference, Triton designs, and the sampler that holds them."""
