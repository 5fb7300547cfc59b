"""The decode runtime: what every decoder's inner loop stands on.

    engine.py      the `engine` key: eager or torch.compile'd cached forwards, checked before generation
    hostsync.py    when a decoder may read a device value on the host (free on the CPU, bounded elsewhere)
    randomness.py  per-image counter-based random streams (Philox-4x32-10) computed on the device
    sampling.py    temperature / top-k / top-p and the one inverse-CDF sampler
    seeding.py     per-image seeds from (seed, prompt id, image index)
"""
