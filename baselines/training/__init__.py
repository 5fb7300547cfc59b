"""Training code: the EAGLE head and the latent up-sampler on the shapes world."""
