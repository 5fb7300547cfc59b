"""The GPT's static KV cache: incremental == full forward, rollback by overwrite, non-contiguous
positions with an explicit mask, CFG wrapper."""
from __future__ import annotations

import pytest
import torch

from harness.models.condition import TextCondition
from harness.models.gpt import GPT, GPTConfig, causal_mask, rope_2d_table
from harness.models.guidance import Guided
from harness.models.random.bundle import build
from harness.shapes.gpt import ShapesConfig, ShapesGPT, partial_rope_table


def _gpt(pos_embed: str = "rope2d", n_kv_head: int | None = None, broadcast: bool = False,
         prefix_rope: str = "identity") -> GPT:
    torch.manual_seed(0)
    cfg = ShapesConfig(vocab_size=32, grid=(4, 4), dim=32, n_layer=2, n_head=4, n_kv_head=n_kv_head,
                       prefix_len=3, caption_dim=16, word_vocab=11, pos_embed=pos_embed,
                       cond_broadcast=broadcast, prefix_rope=prefix_rope)
    gpt = ShapesGPT(cfg).eval()
    torch.nn.init.normal_(gpt.output.weight, std=0.2)
    if pos_embed == "learned":
        torch.nn.init.normal_(gpt.pos_embedding, std=0.2)
    return gpt


def _cond(b: int) -> TextCondition:
    g = torch.Generator().manual_seed(1)
    return TextCondition(null=torch.zeros(b, dtype=torch.bool), ids=torch.randint(0, 11, (b, 3), generator=g))


def _tokens(b: int, n: int = 16) -> torch.Tensor:
    return torch.randint(0, 32, (b, n), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("pos_embed,n_kv,broadcast", [("rope2d", None, False), ("learned", None, False),
                                                      ("rope2d", 2, False), ("rope2d", None, True)])
@torch.inference_mode()
def test_incremental_equals_full_forward(pos_embed: str, n_kv: int | None, broadcast: bool) -> None:
    gpt, cond, toks = _gpt(pos_embed, n_kv, broadcast, "zero" if broadcast else "identity"), _cond(2), _tokens(2)
    full = gpt.forward_train(cond, toks)  # [2, 16, V]
    gpt.setup_cache(2)
    steps = [gpt.prefill(cond)]
    for i in range(15):
        steps.append(gpt.forward_cached(toks[:, i : i + 1], torch.tensor([i]))[:, 0])
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=0)
    # a chunked forward (several positions at once) gives the same logits
    gpt.setup_cache(2)
    first = gpt.prefill(cond)
    chunk = gpt.forward_cached(toks[:, :15], torch.arange(15))
    torch.testing.assert_close(torch.cat([first[:, None], chunk], 1), full, atol=1e-5, rtol=0)


@torch.inference_mode()
def test_broadcast_condition_reaches_every_position() -> None:
    """With cond_broadcast and prefix_rope "zero", changing one caption word changes the logits
    of every image position; a null condition uses the unconditional embedding (CFG)."""
    gpt, toks = _gpt(broadcast=True, prefix_rope="zero"), _tokens(1)
    torch.nn.init.normal_(gpt.cond_broadcast.weight, std=0.2)
    cond = _cond(1)
    other = TextCondition(null=cond.null, ids=cond.ids.roll(1, dims=1))
    a, b = gpt.forward_train(cond, toks), gpt.forward_train(other, toks)
    assert ((a - b).abs().amax(-1) > 1e-4).all()
    null = TextCondition(null=torch.ones(1, dtype=torch.bool), ids=cond.ids)
    null_other = TextCondition(null=torch.ones(1, dtype=torch.bool), ids=other.ids)
    torch.testing.assert_close(gpt.forward_train(null, toks), gpt.forward_train(null_other, toks))


@torch.inference_mode()
def test_rollback_by_overwrite_equals_fresh_recompute() -> None:
    gpt, cond, toks = _gpt(), _cond(2), _tokens(2)
    wrong = toks.clone()
    wrong[:, 6:] = (wrong[:, 6:] + 5) % 32
    gpt.setup_cache(2)
    gpt.prefill(cond)
    gpt.forward_cached(wrong[:, :15], torch.arange(15))  # cache now holds wrong tokens after 6
    redone = gpt.forward_cached(toks[:, 6:15], torch.arange(6, 15))  # overwrite positions 6..14
    fresh = gpt.forward_train(cond, toks)[:, 7:16]
    torch.testing.assert_close(redone, fresh, atol=1e-5, rtol=0)


@torch.inference_mode()
def test_noncontiguous_positions_with_mask_equal_full_sequence() -> None:
    gpt, cond, toks = _gpt(), _cond(2), _tokens(2)
    full = gpt.forward_train(cond, toks)
    gpt.setup_cache(2)
    gpt.prefill(cond)
    gpt.forward_cached(toks[:, :15], torch.arange(15))
    # re-feed positions 3, 9, 12 (per row different for row 1) in one forward with an explicit mask
    pos = torch.tensor([[3, 9, 12], [2, 9, 13]])
    picked = torch.gather(toks, 1, pos)
    mask = causal_mask(pos, gpt.cfg.prefix_len, gpt.slots)
    out = gpt.forward_cached(picked, pos, mask)
    expected = torch.stack([full[0, pos[0] + 1], full[1, pos[1] + 1]])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    # masking out a key changes the result: the mask is really applied
    mask2 = mask.clone()
    mask2[:, :, gpt.cfg.prefix_len + 1] = False
    assert not torch.allclose(gpt.forward_cached(picked, pos, mask2), expected, atol=1e-4)


@torch.inference_mode()
def test_cfg_scale_one_equals_conditional_model() -> None:
    bundle = build(grid=4, vocab=16, dim=32)
    model = bundle.target
    cond = bundle.condition(["a red circle", "two blue squares"])
    guided = Guided(model, 1.0)
    guided.setup_cache(2)
    g0 = guided.prefill(cond)
    g1 = guided.forward(torch.tensor([[1], [2]]), torch.tensor([0]))
    model.setup_cache(2)
    torch.testing.assert_close(g0, model.prefill(cond), atol=1e-5, rtol=0)
    torch.testing.assert_close(g1, model.forward(torch.tensor([[1], [2]]), torch.tensor([0])), atol=1e-5, rtol=0)
    # scale 3 differs (the unconditional branch is really used)
    guided3 = Guided(model, 3.0)
    guided3.setup_cache(2)
    assert not torch.allclose(guided3.prefill(cond), g0, atol=1e-4)


@torch.inference_mode()
def test_word_pos_lets_image_tokens_tell_caption_word_order() -> None:
    """One layer, prefix_rope "zero", no broadcast: image tokens attend to the caption slots as a
    set, so swapping two words changes nothing ("red circle and blue square" == "blue circle and
    red square"); slot embeddings (word_pos) make the order visible."""
    cond, toks = _cond(1), _tokens(1)
    swapped = TextCondition(null=cond.null, ids=cond.ids[:, [1, 0, 2]])
    assert not torch.equal(cond.ids, swapped.ids)
    for word_pos in (False, True):
        torch.manual_seed(0)
        cfg = ShapesConfig(vocab_size=32, grid=(4, 4), dim=32, n_layer=1, n_head=4, prefix_len=3,
                           caption_dim=16, word_vocab=11, prefix_rope="zero", word_pos=word_pos)
        gpt = ShapesGPT(cfg).eval()
        torch.nn.init.normal_(gpt.output.weight, std=0.2)
        if word_pos:
            torch.nn.init.normal_(gpt.word_pos, std=0.5)
        a, b = gpt.forward_train(cond, toks), gpt.forward_train(swapped, toks)
        changed = (a - b).abs().amax().item()
        assert (changed > 1e-3) == word_pos, (word_pos, changed)


def test_rope_fraction_keeps_unrotated_pairs_for_every_slot() -> None:
    table = partial_rope_table((4, 4), 16, 10000.0, 3, "zero", fraction=0.5)  # 8 pairs, 4 rotate
    assert table.shape == (3 + 16, 8, 2)
    assert (table[:3, :4] == 0).all()  # prefix: rotating pairs zeroed (LlamaGen's zero table)
    identity = torch.tensor([1.0, 0.0])
    assert (table[:, 4:] == identity).all()  # no slot rotates the other pairs
    assert not (table[3:, :4] == identity).all()  # image slots rotate the first half
    with pytest.raises(ValueError, match="rope_fraction"):
        ShapesConfig(vocab_size=32, grid=(4, 4), dim=32, n_head=4, rope_fraction=0.3)


@torch.inference_mode()
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_caption_slots_are_chosen_by_content_only_with_unrotated_pairs(fraction: float) -> None:
    """With every pair zeroed on the prefix, attention scores to caption slots are 0 whatever the
    queries and keys (a uniform average: the first image token ignores their weights); unrotated pairs let
    queries weigh the caption slots by content."""
    torch.manual_seed(0)
    cfg = ShapesConfig(vocab_size=32, grid=(4, 4), dim=32, n_layer=1, n_head=4, prefix_len=3, caption_dim=16,
                       word_vocab=11, prefix_rope="zero", rope_fraction=fraction)
    gpt = ShapesGPT(cfg).eval()
    torch.nn.init.normal_(gpt.output.weight, std=0.2)
    cond, toks = _cond(1), _tokens(1)
    before = gpt.forward_train(cond, toks)[:, 0]  # image position 0: predicted from the prefix alone
    queries_keys = gpt.layers[0].attention.wqkv.weight[:64]
    queries_keys.add_(torch.randn_like(queries_keys))
    changed = (gpt.forward_train(cond, toks)[:, 0] - before).abs().max().item()
    assert (changed > 1e-4) == (fraction < 1), changed


def test_word_pos_needs_word_ids() -> None:
    with pytest.raises(ValueError, match="word_pos needs word-id captions"):
        ShapesConfig(vocab_size=32, grid=(4, 4), word_vocab=0, word_pos=True)


@torch.inference_mode()
def test_hidden_tokens_in_training_equal_a_masked_cached_forward() -> None:
    """forward_train's `hidden` [B, N, N] (token j hidden from the prediction of token i) gives
    the logits of a cached forward whose mask hides slot j from the query on slot i - 1; an
    all-False `hidden` changes nothing."""
    gpt, cond, toks = _gpt(), _cond(2), _tokens(2)
    full = gpt.forward_train(cond, toks)
    none = torch.zeros(2, 16, 16, dtype=torch.bool)
    torch.testing.assert_close(gpt.forward_train(cond, toks, hidden=none), full, atol=1e-6, rtol=0)
    hidden = none.clone()
    hidden[0, 9, [2, 3, 6]] = True
    hidden[1, 14, [0, 12]] = True
    gapped = gpt.forward_train(cond, toks, hidden=hidden)
    changed = (gapped - full).abs().amax(-1) > 1e-5  # [B, N]; later layers carry a gap onwards
    assert changed.int().argmax(-1).tolist() == [9, 14] and changed[0, 9:].all() and changed[1, 14:].all()
    gpt.setup_cache(2)
    gpt.prefill(cond)
    pos = torch.arange(15).expand(2, -1)
    mask = causal_mask(pos, gpt.cfg.prefix_len, gpt.slots).clone()
    mask[:, :, gpt.cfg.prefix_len:gpt.cfg.prefix_len + 15] &= ~hidden[:, 1:, :15]
    cached = gpt.forward_cached(toks[:, :15], pos, mask)
    torch.testing.assert_close(cached, gapped[:, 1:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="hidden must have shape"):
        gpt.forward_train(cond, toks, hidden=none[:, :8])


def test_the_official_config_has_no_shapes_options() -> None:
    """GPTConfig is the official architecture (LlamaGen, Tar); word-id captions, slot embeddings,
    broadcast condition, partial RoPE and learned positions are ShapesConfig's."""
    fields = set(GPTConfig.__dataclass_fields__)
    assert not fields & {"word_vocab", "word_pos", "cond_broadcast", "rope_fraction"}
    with pytest.raises(ValueError, match="pos_embed must be one of"):
        GPTConfig(vocab_size=32, grid=(4, 4), dim=32, pos_embed="learned")
    gpt = GPT(GPTConfig(vocab_size=32, grid=(4, 4), dim=32, n_layer=1, prefix_len=3, caption_dim=16)).eval()
    with pytest.raises(ValueError, match="word-id captions need a ShapesGPT"):
        gpt.forward_train(_cond(1), _tokens(1))
    shapes = ShapesGPT(ShapesConfig(vocab_size=32, grid=(4, 4), dim=32, n_layer=1, prefix_len=3,
                                    caption_dim=16, word_vocab=11))
    features = TextCondition(null=torch.zeros(1, dtype=torch.bool), features=torch.randn(1, 3, 16))
    assert shapes.forward_train(features, _tokens(1)).shape == (1, 16, 32)  # features pass through


def test_partial_rope_table_is_the_official_table_on_the_rotating_pairs() -> None:
    full = rope_2d_table((4, 4), 8, 10000.0, 3, "zero")  # 4 pairs
    partial = partial_rope_table((4, 4), 16, 10000.0, 3, "zero", fraction=0.5)  # 4 of 8 pairs rotate
    assert torch.equal(partial[:, :4], full)
    whole = partial_rope_table((4, 4), 16, 10000.0, 3, "zero")  # fraction 1: LlamaGen's table
    assert torch.equal(whole, rope_2d_table((4, 4), 16, 10000.0, 3, "zero"))
