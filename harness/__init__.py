"""mulo-bench: a reproducible benchmark harness for accelerated autoregressive text-to-image
generation. Public contracts live in `harness.api`."""
