"""Decoding strategies, each implementing `harness.api.Decoder`.

    framework/  the speculative loop written once and its parts: canvas, draft sources, acceptance
                rules, rejection scopes, the draft tree and its attention, the recorder
    methods/    the methods: raster, ZipAR, EAGLE-2 / LANTERN's tree decoding, MuLo-SD's drafter,
                up-samplers, pooled rule, local scope and island-parallel resampler
    training/   training the EAGLE head and the latent up-sampler (shapes world)
"""
