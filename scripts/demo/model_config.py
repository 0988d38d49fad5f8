"""The demo model's Qwen3-MoE configuration (shared by train.py, export.py and evaluate.py)."""

CONFIG = dict(
    vocab_size=4096,
    hidden_size=512,            # a multiple of 256: q4_k expert rows (gate/up) are 512 long
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=1024,     # unused: every layer is sparse (decoder_sparse_step=1, mlp_only_layers=[])
    moe_intermediate_size=256,  # a multiple of 256: q4_k expert rows (down) are 256 long
    num_experts=16,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    hidden_act="silu",
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    attention_bias=False,
    attention_dropout=0.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
    sliding_window=None,
    initializer_range=0.02,
    router_aux_loss_coef=0.01,  # Switch-style load-balancing loss, added to the LM loss in training
    output_router_logits=False,  # turned on by train.py while training
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)


def make_config(**over):
    from transformers import Qwen3MoeConfig
    c = dict(CONFIG)
    c.update(over)
    return Qwen3MoeConfig(**c)
