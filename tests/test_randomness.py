"""Per-image counter-based random streams (harness/runtime/randomness.py)."""
from __future__ import annotations

import pytest
import torch

from harness.runtime.randomness import ImageStreams, philox4x32, stream_uniforms
from harness.runtime.seeding import image_seed

# Random123's known-answer vectors for Philox-4x32-10: (counter, key) -> output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_philox_matches_the_known_answers(counter: tuple, key: tuple, expected: tuple) -> None:
    words = philox4x32([torch.tensor(c) for c in counter], [torch.tensor(k) for k in key])
    assert tuple(int(w) for w in words) == expected


def test_draws_are_slices_of_one_stream_whatever_the_block() -> None:
    seeds = [image_seed(0, f"p/{i}", 0) for i in range(3)]
    whole = stream_uniforms(ImageStreams(seeds).keys, 0, 40)
    for block in (1, 3, 7, 4096):
        streams = ImageStreams(seeds, block=block)
        parts = [streams.draw((5,)), streams.draw((2, 3)).flatten(1), streams.draw((29,))]
        assert torch.equal(torch.cat(parts, 1), whole)
    assert torch.equal(stream_uniforms(ImageStreams(seeds).keys, 13, 9), whole[:, 13:22])


def test_an_image_does_not_depend_on_its_batch() -> None:
    seeds = [image_seed(0, f"p/{i}", 0) for i in range(4)]
    batched = ImageStreams(seeds).draw((64,))
    alone = ImageStreams([seeds[2]]).draw((64,))
    assert torch.equal(batched[2], alone[0])
    assert not torch.equal(batched[0], batched[1])


def test_uniforms_are_uniform_in_the_unit_interval() -> None:
    u = ImageStreams([image_seed(1, "x", i) for i in range(8)]).draw((20000,))
    assert u.dtype == torch.float32 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u, bins=16, min=0.0, max=1.0)  # 10,000 expected per bin
    chi2 = float(((counts - 10000) ** 2 / 10000).sum())
    assert chi2 < 50.0  # 15 degrees of freedom: p < 1e-5 beyond 50
    assert abs(float(torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1])) < 0.01


def test_seeds_are_checked() -> None:
    with pytest.raises(ValueError, match="seed"):
        ImageStreams([-1])
    with pytest.raises(ValueError, match="seed"):
        ImageStreams([2**63])
    with pytest.raises(ValueError, match="block"):
        ImageStreams([1], block=0)
