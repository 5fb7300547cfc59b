"""Decoding strategies, one per module, each implementing `harness.api.Decoder`."""
