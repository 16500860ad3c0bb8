"""config.json of DeepSeek-V3 (671B) and DeepSeek-V2-Lite (15.7B) as on the Hub (the fields
the plan reads), for plan tests without weights."""

V3 = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=7168,
    intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
    num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
    n_group=8, topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True,
    vocab_size=129280, max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000, rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
    mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1), topk_method="noaux_tc",
    torch_dtype="bfloat16")
V2_LITE = dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=2048,
    intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
    num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64, routed_scaling_factor=1.0,
    kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
    n_group=1, topk_group=1, num_experts_per_tok=6, first_k_dense_replace=1, norm_topk_prob=False,
    vocab_size=102400, max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000, rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
    mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1), topk_method="greedy",
    torch_dtype="bfloat16")
