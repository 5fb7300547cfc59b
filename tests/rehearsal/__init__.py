"""The rehearsal of the real-model path: a local model hub and mirror (hub.py), the stand-in
repositories it serves (standins.py) and the tiny open_clip architectures (site/sitecustomize.py)."""
