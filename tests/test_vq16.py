"""VQ-16: the official key layout at full size, encode -> decode shapes, l2-normalised codebook."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.models.vq16 import VQConfig, VQModel
from tests.official_keys import diff, keys_of, recorded

TINY = VQConfig(codebook_size=64, base_channels=32, z_channels=32, usage_buffer=0)


def test_full_size_keys_equal_the_official_fixture() -> None:
    with torch.device("meta"):
        vq = VQModel()
    assert diff(keys_of(vq), recorded("llamagen_vq_ds16_t2i.txt")) == ""
    assert vq.cfg.downsample == 16


@torch.inference_mode()
def test_encode_decode_shapes_and_dtypes() -> None:
    torch.manual_seed(0)
    vq = VQModel(TINY).eval()
    images = torch.randint(0, 256, (2, 3, 64, 48), dtype=torch.uint8)
    tokens = vq.encode(images)
    assert tokens.shape == (2, 4, 3) and tokens.dtype == torch.int64
    assert int(tokens.max()) < 64
    out = vq.decode(tokens)
    assert out.shape == (2, 3, 64, 48) and out.dtype == torch.uint8


@torch.inference_mode()
def test_codebook_is_l2_normalised_and_lookup_is_cosine_nearest() -> None:
    torch.manual_seed(0)
    vq = VQModel(TINY).eval()
    torch.nn.init.normal_(vq.quantize.embedding.weight)  # raw rows of any norm
    codes = vq.codebook
    torch.testing.assert_close(codes.norm(dim=-1), torch.ones(64))
    z = torch.randn(1, 8, 2, 2) * 5
    idx = vq.quantize.lookup(z)
    cos = F.normalize(z.permute(0, 2, 3, 1), dim=-1) @ codes.t()
    assert torch.equal(idx, cos.argmax(-1))
    # decoding embeds the normalised code vectors
    torch.testing.assert_close(vq.quantize.embed(idx)[0, :, 0, 0], codes[idx[0, 0, 0]])
    # a latent equal to a code (up to scale) maps to that code
    assert int(vq.quantize.lookup(3.0 * codes[17].view(1, 8, 1, 1)).item()) == 17


def test_wrong_image_size_is_a_clear_error() -> None:
    vq = VQModel(TINY)
    try:
        vq.encode(torch.zeros(1, 3, 40, 64, dtype=torch.uint8))
    except ValueError as err:
        assert "multiple of 16" in str(err)
    else:
        raise AssertionError("expected a ValueError")
