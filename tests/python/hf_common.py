"""What the relaymoe.hf scripts (hf_train.py, hf_generate.py) share: the
skip where torch or transformers is absent, and the tiny Qwen2-MoE model
they run (2 layers, 8 experts of 16, top-2, a gated shared expert)."""
import os
import sys


def require_hf(name):
    """Exits 77 (skipped) where torch or transformers cannot be imported; 1
    (a failure) under RMOE_EMBED_REQUIRE=1, as CI runs them."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"{name}: {e}: skipped")
        sys.exit(1 if os.environ.get("RMOE_EMBED_REQUIRE") == "1" else 77)


def tiny_qwen2_moe(**overrides):
    """The Qwen2MoeConfig of the tiny model, with overrides."""
    from transformers import Qwen2MoeConfig
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
              shared_expert_intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
              attn_implementation="eager")
    kw.update(overrides)
    return Qwen2MoeConfig(**kw)
