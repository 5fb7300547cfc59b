"""The speculative decoding framework: one loop and the parts a method composes it from."""
