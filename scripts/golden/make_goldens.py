#!/usr/bin/env python3
"""Generate Strata's golden test fixtures (tiny random MoE models) from HF transformers.

Cases (one folder each under --out, default tests/golden/):
  qwen3moe_f32   Qwen3MoeForCausalLM, float32, untied, norm_topk_prob=True, 3 layers
  qwen3moe_bf16  Qwen3MoeForCausalLM, bf16 weights on disk, tied embeddings, norm_topk_prob=False
  mixtral_f32    MixtralForCausalLM, float32, untied, HF folder sharded into 2 safetensors + index
  qwen3moe_mixed Qwen3MoeForCausalLM, float32, hidden 256 (k-quant sized), ONE GGUF whose matrices
                 each use a different type (Q4_0 ... MXFP4, F16, BF16; see MIXED_TYPES); the HF
                 folder is not kept (only config.json), the GGUF bytes define the weights
  olmoe_f32      OlmoeForCausalLM, float32, QK-norm over the full q/k width, no top-k renorm
  qwen2moe_f32   Qwen2MoeForCausalLM, float32, QKV bias, shared expert + sigmoid gate, a dense
                 MLP layer (mlp_only_layers=[1])
  deepseek2_f32  DeepseekV2ForCausalLM, MLA with q LoRA, group-limited greedy routing, shared expert,
                 leading dense layer; GGUF with the fused attn_kv_b (older llama.cpp converters)
  deepseek2lite_f32  DeepseekV2ForCausalLM without q LoRA (V2-Lite); GGUF with split attn_k_b/attn_v_b
  deepseek3_f32  DeepseekV3ForCausalLM, sigmoid routing + correction bias, 4 groups / 2 kept, YaRN
  gptoss_f32     GptOssForCausalLM, sinks, sliding window on even layers, biases, clamped SwiGLU,
                 YaRN; GGUF f32 and MXFP4 experts

Every case folder holds hf/ (config.json + hub-named safetensors), tokens.bin, logits.bin,
model-<variant>.gguf, logits-<variant>.bin (for quantized variants) and meta.json.
See tests/golden/README.md for the formats.

Requirements: torch, transformers 5.17..5.24, safetensors, numpy, gguf (>=0.10). Runs offline,
on CPU, float32, single-threaded, fully seeded. Nothing is downloaded.

Usage: python scripts/golden/make_goldens.py --out tests/golden [--cases|--only qwen3moe_f32,...]
meta.json records the transformers / torch / gguf versions that produced each case.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
import safetensors
import safetensors.torch
import transformers
from transformers import AutoModelForCausalLM

import gguf
from gguf import GGMLQuantizationType as QT

# ----------------------------------------------------------------------------------------------
# Global settings: CPU, float32, deterministic
# ----------------------------------------------------------------------------------------------
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_num_threads(1)
DEVICE = torch.device("cpu")

N_PROMPT = 12
N_GEN = 8
# Decisiveness thresholds: the (seeded) case is re-drawn with seed+1, +2, ... until every
# router top-k boundary and every greedy argmax has at least this margin (in logit units),
# so that small numeric differences in an engine cannot flip expert choice / greedy token.
MIN_ROUTER_GAP = 0.05
MIN_GREEDY_GAP = 0.05
MAX_ATTEMPTS = 200
MIN_DISTINCT_GEN = 4  # distinct ids required among the N_GEN greedy tokens

# llama.cpp LlamaFileType values for general.file_type
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32, "mxfp4": 38}
VARIANT_QT = {"f32": QT.F32, "f16": QT.F16, "q8_0": QT.Q8_0, "bf16": QT.BF16}

COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_dropout=0.0,
    use_cache=True,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

# qwen3moe_mixed: one GGUF type per matrix, every type at least once (norms / router stay F32).
# 16 matrices for 15 types: Q8_0 appears twice. The coarse types (Q2_K, Q3_K, MXFP4) sit on the
# last layer's experts, where their rounding cannot move any router's input; what feeds a router
# (embeddings, layer 0, layer 1 attention) gets 4..16-bit types.
MIXED_TYPES = {
    "token_embd.weight": QT.Q8_0,
    "output.weight": QT.IQ4_XS,
    "blk.0.attn_q.weight": QT.Q4_0,
    "blk.0.attn_k.weight": QT.Q4_1,
    "blk.0.attn_v.weight": QT.IQ4_NL,
    "blk.0.attn_output.weight": QT.Q5_0,
    "blk.0.ffn_gate_exps.weight": QT.Q5_K,
    "blk.0.ffn_up_exps.weight": QT.Q6_K,
    "blk.0.ffn_down_exps.weight": QT.Q4_K,
    "blk.1.attn_q.weight": QT.F16,
    "blk.1.attn_k.weight": QT.BF16,
    "blk.1.attn_v.weight": QT.Q5_1,
    "blk.1.attn_output.weight": QT.Q8_0,
    "blk.1.ffn_gate_exps.weight": QT.Q2_K,
    "blk.1.ffn_up_exps.weight": QT.Q3_K,
    "blk.1.ffn_down_exps.weight": QT.MXFP4,
}
MIXED_ALL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                   "IQ4_NL", "IQ4_XS", "MXFP4", "F16", "BF16"]
assert set(MIXED_ALL_TYPES) == {t.name for t in MIXED_TYPES.values()}

CASES = {
    "qwen3moe_f32": dict(
        arch="qwen3moe", model_type="qwen3_moe", cls="Qwen3MoeForCausalLM", seed=1001,
        store_dtype="float32", tied=False, variants=["f32", "f16", "q8_0"], shards=1,
        cfg=dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=32,
                 num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                 rope_theta=1e6, router_aux_loss_coef=0.0, output_router_logits=False,
                 use_sliding_window=False, sliding_window=None),
    ),
    "qwen3moe_bf16": dict(
        arch="qwen3moe", model_type="qwen3_moe", cls="Qwen3MoeForCausalLM", seed=2002,
        store_dtype="bfloat16", tied=True, variants=["bf16"], shards=1,
        # write the expert count the way real Qwen3-MoE hub configs do ("num_experts");
        # qwen3moe_f32 keeps transformers' own spelling ("num_local_experts", via attribute_map)
        expert_count_key="num_experts",
        # tied: lm_head == embeddings, so smaller embeddings / larger block matrices keep the
        # residual stream from simply predicting the current token again (x x x x ...)
        embd_std=0.3, mat_std=0.2,
        cfg=dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=32,
                 num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                 decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                 rope_theta=1e6, router_aux_loss_coef=0.0, output_router_logits=False,
                 use_sliding_window=False, sliding_window=None),
    ),
    "mixtral_f32": dict(
        arch="llama", model_type="mixtral", cls="MixtralForCausalLM", seed=3003,
        store_dtype="float32", tied=False, variants=["f32", "f16", "q8_0"], shards=2,
        cfg=dict(num_hidden_layers=2, intermediate_size=32, num_local_experts=8,
                 num_experts_per_tok=2, rope_theta=1e4, router_aux_loss_coef=0.0,
                 output_router_logits=False, router_jitter_noise=0.0, sliding_window=None),
    ),
    "qwen3moe_mixed": dict(
        arch="qwen3moe", model_type="qwen3_moe", cls="Qwen3MoeForCausalLM", seed=4004,
        store_dtype="float32", tied=False, variants=["mixed"], shards=1,
        # 2..6-bit weights move the routers' inputs far more than their margins: the mixed model
        # cannot route like the f32 one, so only its own margins (>= MIN_ROUTER_GAP) are required
        same_routing=False,
        keep_hf=False,  # 13 MB of float32 safetensors; only hf config.json is kept (as config.json)
        # every matrix row is 256 long (k-quant super-block); std scaled down with the width so
        # activations stay like the small cases'
        mat_std=0.05, lm_std=0.15,
        cfg=dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 num_hidden_layers=2, intermediate_size=256, moe_intermediate_size=256,
                 num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                 rope_theta=1e6, router_aux_loss_coef=0.0, output_router_logits=False,
                 use_sliding_window=False, sliding_window=None),
    ),
    "olmoe_f32": dict(
        arch="olmoe", model_type="olmoe", cls="OlmoeForCausalLM", seed=5005,
        store_dtype="float32", tied=False, variants=["f32"], shards=1,
        cfg=dict(num_hidden_layers=3, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                 norm_topk_prob=False, rope_theta=1e4, router_aux_loss_coef=0.0,
                 output_router_logits=False, clip_qkv=None, attention_bias=False, rms_norm_eps=1e-5),
    ),
    "qwen2moe_f32": dict(
        arch="qwen2moe", model_type="qwen2_moe", cls="Qwen2MoeForCausalLM", seed=6006,
        store_dtype="float32", tied=False, variants=["f32"], shards=1,
        cfg=dict(num_hidden_layers=3, intermediate_size=48, moe_intermediate_size=32,
                 shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
                 norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1], qkv_bias=True,
                 rope_theta=1e6, router_aux_loss_coef=0.0, output_router_logits=False,
                 use_sliding_window=False, sliding_window=None),
    ),
    # DeepSeek-V2 with q LoRA, group-limited greedy routing, a leading dense layer, one shared expert;
    # GGUF as older llama.cpp converters wrote it (fused attn_kv_b, per-head key/value_length)
    "deepseek2_f32": dict(
        arch="deepseek2", model_type="deepseek_v2", cls="DeepseekV2ForCausalLM", seed=7007,
        store_dtype="float32", tied=False, variants=["f32"], shards=1, gguf_kv_b="fused",
        cfg=dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, v_head_dim=16, intermediate_size=48,
                 moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=1.5,
                 topk_method="group_limited_greedy", n_group=4, topk_group=1, norm_topk_prob=False,
                 rope_theta=1e4, attention_bias=False, mlp_bias=False),
    ),
    # DeepSeek-V2-Lite: no q LoRA (one q_proj), greedy routing; GGUF as current llama.cpp writes it
    # (split attn_k_b / attn_v_b, latent key/value_length + *_mla keys, head_count_kv 1)
    "deepseek2lite_f32": dict(
        arch="deepseek2", model_type="deepseek_v2", cls="DeepseekV2ForCausalLM", seed=8008,
        store_dtype="float32", tied=False, variants=["f32"], shards=1, gguf_kv_b="split",
        cfg=dict(num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, v_head_dim=16, intermediate_size=48,
                 moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=1.0,
                 topk_method="greedy", norm_topk_prob=False, rope_theta=1e4,
                 attention_bias=False, mlp_bias=False),
    ),
    # DeepSeek-V3: sigmoid scores + e_score_correction_bias, 4 groups / 2 kept, renormalised and
    # scaled weights, YaRN RoPE (factor 4, mscale = mscale_all_dim = 1: the softmax scale grows by
    # mscale^2), interleaved RoPE pairs
    "deepseek3_f32": dict(
        arch="deepseek2", model_type="deepseek_v3", cls="DeepseekV3ForCausalLM", seed=9009,
        store_dtype="float32", tied=False, variants=["f32"], shards=1, gguf_kv_b="split",
        rope=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128, beta_fast=32.0,
                  beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
        cfg=dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, v_head_dim=16, intermediate_size=48,
                 moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                 n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
                 n_group=4, topk_group=2, norm_topk_prob=True, rope_interleave=True,
                 rope_theta=1e4, attention_bias=False),
    ),
    # gpt-oss: attention sinks, sliding window 4 on the even layers, q/k/v/o and expert biases,
    # interleaved fused gate_up stored input-major, clamped SwiGLU (expert matrices large enough that
    # the clamp at 7 engages), YaRN (factor 8, no truncation); GGUF f32 and MXFP4 experts
    "gptoss_f32": dict(
        arch="gpt-oss", model_type="gpt_oss", cls="GptOssForCausalLM", seed=10010,
        store_dtype="float32", tied=False, variants=["f32", "mxfp4"], shards=1,
        rope=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=64, beta_fast=32.0,
                  beta_slow=1.0, truncate=False),
        std_overrides={"mlp.experts.gate_up_proj": 0.6, "mlp.experts.down_proj": 0.05,
                       "self_attn.sinks": 1.0, "mlp.router.weight": 1.0},
        # MXFP4 experts move the later routers' inputs more than their margins (as in qwen3moe_mixed):
        # that variant must be decisive under its own weights, not route like the f32 model
        same_routing=False,
        cfg=dict(num_hidden_layers=2, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                 sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                 swiglu_limit=7.0, rope_theta=1.5e5, attention_bias=True, router_aux_loss_coef=0.0,
                 output_router_logits=False, rms_norm_eps=1e-5),
    ),
}

# Families added for issue 7: their GGUF mapping, metadata and (no) numpy GGML forward live in
# the *_family helpers below, so the original cases' bytes are untouched.
FAMILY_ARCHS = {"olmoe", "qwen2moe", "deepseek2", "gpt-oss"}


# ----------------------------------------------------------------------------------------------
# Model construction
# ----------------------------------------------------------------------------------------------
def make_config(case: dict):
    c = dict(COMMON)
    c.update(case["cfg"])
    theta = c.pop("rope_theta")
    # transformers >= 5 spells RoPE as rope_parameters (legacy top-level rope_theta still accepted)
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    if "rope" in case:  # YaRN (DeepSeek-V3, gpt-oss)
        c["rope_parameters"] = {"rope_theta": theta, **case["rope"]}
    c["tie_word_embeddings"] = case["tied"]
    config = transformers.AutoConfig.for_model(case["model_type"], **c)
    config.architectures = [case["cls"]]
    return config, theta


def impl_kwargs():
    # eager attention + eager (per-expert loop) MoE: the most literal reference implementation
    return dict(attn_implementation="eager", experts_implementation="eager")


def build_model(case: dict, seed: int):
    config, _ = make_config(case)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **impl_kwargs())
    model.eval()
    # Overwrite EVERY parameter from our own generator in sorted-name order, so the weights do
    # not depend on transformers' init order (differs across versions).
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        params = dict(model.named_parameters())  # tied params appear once
        overrides = case.get("std_overrides", {})
        for name in sorted(params):
            p = params[name]
            hit = [k for k in overrides if name.endswith(k)]
            if hit:
                val = overrides[hit[0]] * torch.randn(p.shape, generator=g)
            elif name.endswith("norm.weight"):  # input/post_attention/final norms + q_norm/k_norm
                val = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif name.endswith("mlp.gate.weight"):  # router: large so top-k is decisive
                val = 0.5 * torch.randn(p.shape, generator=g)
            elif name.endswith("shared_expert_gate.weight"):  # sigmoid gate away from 0.5
                val = 0.5 * torch.randn(p.shape, generator=g)
            elif name.endswith("embed_tokens.weight"):  # (doubles as lm_head when tied)
                val = case.get("embd_std", 0.5) * torch.randn(p.shape, generator=g)
            elif name.startswith("lm_head"):
                val = case.get("lm_std", 0.3) * torch.randn(p.shape, generator=g)
            else:  # attention projections, expert / dense MLP matrices
                val = case.get("mat_std", 0.1) * torch.randn(p.shape, generator=g)
            p.copy_(val.to(p.dtype))
        # DeepSeek-V3's selection bias is a buffer: drawn after the parameters, same generator
        buffers = dict(model.named_buffers())
        for name in sorted(buffers):
            if name.endswith("e_score_correction_bias"):
                buffers[name].copy_(0.1 * torch.randn(buffers[name].shape, generator=g))
        if case["store_dtype"] == "bfloat16":
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    if case["tied"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


# ----------------------------------------------------------------------------------------------
# transformers (fused experts) <-> hub naming (per-expert)
# transformers 5.x stores experts fused:
#   mlp.experts.gate_up_proj [E, 2*I, H]: rows [0:I] = gate_proj (w1), rows [I:2I] = up_proj (w3)
#   mlp.experts.down_proj    [E, H, I]   = down_proj (w2)
# Mixtral additionally renames block_sparse_moe -> mlp on load.
# ----------------------------------------------------------------------------------------------
def model_sd_to_hub(sd: dict, case: dict) -> dict:
    mixtral = case["model_type"] == "mixtral"
    out = {}
    if case["model_type"] == "gpt_oss":  # the hub layout IS transformers' (input-major experts)
        return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in sd.items()}
    for k, v in sd.items():
        v = v.detach().to(torch.float32).contiguous()
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("mlp.experts.gate_up_proj")]
            E, two_i, _ = v.shape
            I = two_i // 2
            for e in range(E):
                gate, up = v[e, :I], v[e, I:]
                if mixtral:
                    out[f"{pre}block_sparse_moe.experts.{e}.w1.weight"] = gate.clone()
                    out[f"{pre}block_sparse_moe.experts.{e}.w3.weight"] = up.clone()
                else:
                    out[f"{pre}mlp.experts.{e}.gate_proj.weight"] = gate.clone()
                    out[f"{pre}mlp.experts.{e}.up_proj.weight"] = up.clone()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("mlp.experts.down_proj")]
            for e in range(v.shape[0]):
                if mixtral:
                    out[f"{pre}block_sparse_moe.experts.{e}.w2.weight"] = v[e].clone()
                else:
                    out[f"{pre}mlp.experts.{e}.down_proj.weight"] = v[e].clone()
        elif mixtral and ".mlp.gate." in k:
            out[k.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = v.clone()
        else:
            out[k] = v.clone()
    if case["tied"]:
        out.pop("lm_head.weight", None)  # real tied checkpoints omit it
    return out


def hub_to_model_sd(hub: dict, case: dict, n_layers: int, n_exp: int) -> dict:
    mixtral = case["model_type"] == "mixtral"
    hub = dict(hub)
    if case["model_type"] == "gpt_oss":
        return hub
    out = {}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        if mixtral:
            names = [f"{p}block_sparse_moe.experts.{{e}}.{w}.weight" for w in ("w1", "w3", "w2")]
        else:
            names = [f"{p}mlp.experts.{{e}}.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
        if names[0].format(e=0) not in hub:  # a dense MLP layer (qwen2moe mlp_only_layers)
            continue
        gate = torch.stack([hub.pop(names[0].format(e=e)) for e in range(n_exp)])
        up = torch.stack([hub.pop(names[1].format(e=e)) for e in range(n_exp)])
        down = torch.stack([hub.pop(names[2].format(e=e)) for e in range(n_exp)])
        out[f"{p}mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[f"{p}mlp.experts.down_proj"] = down
    for k, v in hub.items():
        out[k.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = v
    return out


def load_model_sd(model, sd: dict, tied: bool):
    with torch.no_grad():
        params = dict(model.named_parameters())
        # persistent buffers that are weights of the checkpoint (DeepSeek-V3's selection bias)
        params.update({k: b for k, b in model.named_buffers() if k.endswith("e_score_correction_bias")})
        expected = set(params)
        got = set(sd) | ({"lm_head.weight"} & expected if tied else set())
        assert expected == got, sorted(expected ^ got)
        for k, p in params.items():
            if k in sd:
                assert tuple(p.shape) == tuple(sd[k].shape), (k, p.shape, sd[k].shape)
                p.copy_(sd[k].to(torch.float32))
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# ----------------------------------------------------------------------------------------------
# HF folder writing
# ----------------------------------------------------------------------------------------------
def write_hf(hf_dir: str, model, case: dict, theta: float):
    os.makedirs(hf_dir, exist_ok=True)
    hub = model_sd_to_hub(model.state_dict(), case)
    st_dtype = torch.bfloat16 if case["store_dtype"] == "bfloat16" else torch.float32
    hub = {k: v.to(st_dtype).contiguous() for k, v in sorted(hub.items())}

    # config.json: exactly what transformers writes, then (mixtral) rewrite to legacy hub spellings
    with tempfile.TemporaryDirectory() as td:
        model.config.save_pretrained(td)
        with open(os.path.join(td, "config.json")) as f:
            cfg = json.load(f)
    for k in ("_experts_implementation", "_attn_implementation", "experts_implementation",
              "attn_implementation"):
        cfg.pop(k, None)
    cfg["architectures"] = [case["cls"]]
    if case["model_type"] == "mixtral":
        rp = cfg.pop("rope_parameters", None)
        assert rp is None or rp.get("rope_type", "default") == "default"
        cfg["rope_theta"] = float(theta)
        cfg.pop("num_experts", None)
        cfg["num_local_experts"] = int(case["cfg"]["num_local_experts"])
        if "dtype" in cfg:
            cfg["torch_dtype"] = cfg.pop("dtype")
        rope_spelling = "rope_theta"
        cfg["torch_dtype"] = case["store_dtype"]
    else:
        assert "rope_parameters" in cfg, "expected transformers to write rope_parameters"
        cfg.pop("rope_theta", None)
        rope_spelling = "rope_parameters"
        cfg["dtype"] = case["store_dtype"]
        key = case.get("expert_count_key")
        if key is not None:
            n = cfg.pop("num_local_experts", None)
            n = cfg.pop("num_experts", n)
            cfg[key] = int(n)
    cfg = dict(sorted(cfg.items()))
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    meta = {"format": "pt"}
    if case["shards"] == 1:
        safetensors.torch.save_file(hub, os.path.join(hf_dir, "model.safetensors"), metadata=meta)
        files = ["model.safetensors"]
    else:
        n = case["shards"]
        names = list(hub)  # sorted
        sizes = [hub[k].numel() * hub[k].element_size() for k in names]
        total = sum(sizes)
        shards, cur, acc = [[] for _ in range(n)], 0, 0
        for k, s in zip(names, sizes):
            if cur < n - 1 and acc >= total * (cur + 1) / n:
                cur += 1
            shards[cur].append(k)
            acc += s
        weight_map = {}
        files = []
        for si, keys in enumerate(shards):
            fn = f"model-{si + 1:05d}-of-{n:05d}.safetensors"
            safetensors.torch.save_file({k: hub[k] for k in keys}, os.path.join(hf_dir, fn), metadata=meta)
            files.append(fn)
            for k in keys:
                weight_map[k] = fn
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(hf_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        files.append("model.safetensors.index.json")
    return hub, rope_spelling, files


# ----------------------------------------------------------------------------------------------
# Forward helpers
# ----------------------------------------------------------------------------------------------
def router_of(mlp):
    """The router module of a MoE block (gpt-oss: mlp.router, others: mlp.gate); None on a dense MLP."""
    r = getattr(mlp, "router", None)
    return r if r is not None else getattr(mlp, "gate", None)


class RouterProbe:
    """Records router logits of every MoE layer via forward hooks on mlp.gate."""

    def __init__(self, model):
        self.logits = []
        self.handles = []
        for layer in model.model.layers:
            gate = router_of(layer.mlp)
            if gate is not None:
                self.handles.append(gate.register_forward_hook(self._hook))

    def _hook(self, mod, inp, out):
        t = out[0] if isinstance(out, (tuple, list)) else out
        self.logits.append(t.detach().reshape(-1, t.shape[-1]).float().clone())

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def forward_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long, device=DEVICE)
    out = model(input_ids=x, use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def router_stats(model, ids: list[int], top_k: int) -> tuple[float, list]:
    """(min over layers/tokens of logit gap between k-th and (k+1)-th expert, chosen expert sets)"""
    probe = RouterProbe(model)
    try:
        forward_logits(model, ids)
    finally:
        probe.close()
    gaps, sel = [], []
    moe_layers = [layer.mlp for layer in model.model.layers if router_of(layer.mlp) is not None]
    for li, rl in enumerate(probe.logits):
        choice, gap_scale, group_gap = selection_scores(model.config, moe_layers[li], rl)
        s, idx = torch.sort(choice, dim=-1, descending=True)
        gaps.append(min((s[:, top_k - 1] - s[:, top_k]).min().item() * gap_scale, group_gap))
        sel.append(torch.sort(idx[:, :top_k], dim=-1).values)
    return float(min(gaps)), sel


def selection_scores(cfg, mlp, logits: torch.Tensor):
    """What the router ranks to select experts (experts of dropped groups at -inf), the factor
    that puts a gap of it on the logit scale of MIN_ROUTER_GAP, and for DeepSeek's grouped routing
    the margin between the last kept and the first dropped group on that scale (inf otherwise)."""
    mt = cfg.model_type
    if mt == "deepseek_v3":
        choice = logits.sigmoid() + mlp.gate.e_score_correction_bias.float()
        per = choice.shape[-1] // cfg.n_group
        grp = choice.view(-1, cfg.n_group, per).topk(2, dim=-1)[0].sum(-1)
        scale = 5.0  # sigmoid scores: a gap of 0.01 counts as 0.05 logits
    elif mt == "deepseek_v2" and cfg.topk_method == "group_limited_greedy":
        choice = logits  # softmax is monotone: rank logits
        per = choice.shape[-1] // cfg.n_group
        grp = choice.view(-1, cfg.n_group, per).max(dim=-1).values
        scale = 1.0
    else:
        return logits, 1.0, float("inf")
    gs = torch.sort(grp, dim=-1, descending=True).values
    group_gap = (gs[:, cfg.topk_group - 1] - gs[:, cfg.topk_group]).min().item()
    keep = torch.zeros_like(grp, dtype=torch.bool)
    keep.scatter_(1, grp.topk(cfg.topk_group, dim=-1)[1], True)
    mask = keep.unsqueeze(-1).expand(-1, cfg.n_group, per).reshape(choice.shape)
    return choice.masked_fill(~mask, float("-inf")), scale, group_gap * scale


def router_gap(model, ids: list[int], top_k: int) -> float:
    return router_stats(model, ids, top_k)[0]


def same_selection(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def top_gap(logits: torch.Tensor) -> float:
    s = torch.sort(logits, dim=-1, descending=True).values
    return float((s[..., 0] - s[..., 1]).min().item())


@torch.no_grad()
def greedy(model, prompt: list[int], n: int) -> tuple[list[int], float]:
    ids = list(prompt)
    gaps = []
    for _ in range(n):
        lg = forward_logits(model, ids)[-1]
        gaps.append(top_gap(lg))
        ids.append(int(torch.argmax(lg).item()))
    return ids, float(min(gaps))


# ----------------------------------------------------------------------------------------------
# GGUF
# ----------------------------------------------------------------------------------------------
def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half row order -> llama.cpp adjacent-pair row order (as convert_hf_to_gguf.py).

    Per head of d rows, HF rotates pairs (j, j + d/2); GGML's normal RoPE rotates (2j, 2j+1)
    with the same frequency theta^(-2j/d). New row 2j = old row j, new row 2j+1 = old row j+d/2.
    """
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def check_rope_permutation(head_dim: int, n_head: int, theta: float) -> None:
    """Numerically prove: adjacent-pair RoPE on permuted rows == permuted (rotate-half RoPE)."""
    g = torch.Generator().manual_seed(0)
    H = 8
    w = torch.randn(n_head * head_dim, H, generator=g, dtype=torch.float64)
    x = torch.randn(5, H, generator=g, dtype=torch.float64)
    pos = torch.arange(5, dtype=torch.float64)
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [d/2]
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    # HF rotate-half
    q = (x @ w.T).reshape(5, n_head, head_dim)
    q1, q2 = q[..., : head_dim // 2], q[..., head_dim // 2:]
    c, s = cos[:, None, :], sin[:, None, :]
    hf = torch.cat([q1 * c - q2 * s, q2 * c + q1 * s], dim=-1)
    # GGML normal (adjacent pairs) on permuted weights
    wp = torch.from_numpy(permute_rope(w.numpy(), n_head))
    qp = (x @ wp.T).reshape(5, n_head, head_dim // 2, 2)
    a, b = qp[..., 0], qp[..., 1]
    gg = torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(5, n_head, head_dim)
    # HF output in GGUF row order: new dim 2j = old j, new dim 2j+1 = old j + d/2
    hf_perm = hf.reshape(5, n_head, 2, head_dim // 2).transpose(-1, -2).reshape(5, n_head, head_dim)
    assert torch.allclose(gg, hf_perm, atol=1e-12), "RoPE permutation check failed"
    assert np.array_equal(unpermute_rope(permute_rope(w.numpy(), n_head), n_head), w.numpy())


FAMILY_ATTN = {  # GGUF name -> hub name under model.layers.N.
    "attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias", "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
FAMILY_EXPERTS = (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj"))


DEEPSEEK_ATTN = {  # GGUF name -> hub name under model.layers.N. (DeepSeek-V2/V3)
    "attn_norm.weight": "input_layernorm.weight", "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight", "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
GPTOSS_ATTN = {  # GGUF name -> hub name under model.layers.N. (gpt-oss)
    "attn_norm.weight": "input_layernorm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks.weight": "self_attn.sinks", "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
}


def hub_to_gguf_deepseek_gptoss(t: dict, case: dict, c: dict, out: dict) -> None:
    """Per-layer llama.cpp tensors of deepseek2 / gpt-oss, as convert_hf_to_gguf.py writes them:
    deepseek2 kv_b either as is (older converters) or split per head into attn_k_b (transposed) and
    attn_v_b; gpt-oss experts split out of the interleaved input-major gate_up and transposed."""
    for i in range(c["n_layer"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names = DEEPSEEK_ATTN if case["arch"] == "deepseek2" else GPTOSS_ATTN
        for gn, hn in names.items():
            if p + hn in t:
                out[b + gn] = t[p + hn]
        if case["arch"] == "deepseek2":
            kv_b = t[p + "self_attn.kv_b_proj.weight"]
            if case["gguf_kv_b"] == "fused":
                out[b + "attn_kv_b.weight"] = kv_b
            else:
                H, nope, v = c["n_head"], c["qk_nope"], c["v_head"]
                kv = kv_b.reshape(H, nope + v, kv_b.shape[-1])
                out[b + "attn_k_b.weight"] = np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))
                out[b + "attn_v_b.weight"] = np.ascontiguousarray(kv[:, nope:, :])
            if p + "mlp.experts.0.gate_proj.weight" in t:
                for gn, hn in FAMILY_EXPERTS:
                    out[b + gn + ".weight"] = np.stack([t[f"{p}mlp.experts.{e}.{hn}.weight"]
                                                        for e in range(c["n_expert"])])
        else:
            gu, gub = t[p + "mlp.experts.gate_up_proj"], t[p + "mlp.experts.gate_up_proj_bias"]
            out[b + "ffn_gate_exps.weight"] = np.ascontiguousarray(gu[:, :, 0::2].transpose(0, 2, 1))
            out[b + "ffn_up_exps.weight"] = np.ascontiguousarray(gu[:, :, 1::2].transpose(0, 2, 1))
            out[b + "ffn_down_exps.weight"] = np.ascontiguousarray(
                t[p + "mlp.experts.down_proj"].transpose(0, 2, 1))
            out[b + "ffn_gate_exps.bias"] = np.ascontiguousarray(gub[:, 0::2])
            out[b + "ffn_up_exps.bias"] = np.ascontiguousarray(gub[:, 1::2])
            out[b + "ffn_down_exps.bias"] = t[p + "mlp.experts.down_proj_bias"]


def gguf_to_hub_deepseek_gptoss(gt: dict, case: dict, c: dict, h: dict) -> None:
    for i in range(c["n_layer"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        names = DEEPSEEK_ATTN if case["arch"] == "deepseek2" else GPTOSS_ATTN
        for gn, hn in names.items():
            if b + gn in gt:
                h[p + hn] = gt[b + gn]
        if case["arch"] == "deepseek2":
            if b + "attn_kv_b.weight" in gt:
                h[p + "self_attn.kv_b_proj.weight"] = gt[b + "attn_kv_b.weight"]
            else:
                k_b, v_b = gt[b + "attn_k_b.weight"], gt[b + "attn_v_b.weight"]
                kv = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
                h[p + "self_attn.kv_b_proj.weight"] = kv.reshape(-1, kv.shape[-1])
            if b + "ffn_gate_exps.weight" in gt:
                for gn, hn in FAMILY_EXPERTS:
                    for e in range(c["n_expert"]):
                        h[f"{p}mlp.experts.{e}.{hn}.weight"] = gt[b + gn + ".weight"][e]
        else:
            g, u = gt[b + "ffn_gate_exps.weight"], gt[b + "ffn_up_exps.weight"]  # (E, F, D)
            gu = np.empty((g.shape[0], g.shape[2], 2 * g.shape[1]), dtype=np.float32)
            gu[:, :, 0::2], gu[:, :, 1::2] = g.transpose(0, 2, 1), u.transpose(0, 2, 1)
            h[p + "mlp.experts.gate_up_proj"] = gu
            gb, ub = gt[b + "ffn_gate_exps.bias"], gt[b + "ffn_up_exps.bias"]
            gub = np.empty((gb.shape[0], 2 * gb.shape[1]), dtype=np.float32)
            gub[:, 0::2], gub[:, 1::2] = gb, ub
            h[p + "mlp.experts.gate_up_proj_bias"] = gub
            h[p + "mlp.experts.down_proj"] = gt[b + "ffn_down_exps.weight"].transpose(0, 2, 1)
            h[p + "mlp.experts.down_proj_bias"] = gt[b + "ffn_down_exps.bias"]


def hub_to_gguf_tensors_family(hub: dict, case: dict, c: dict) -> dict:
    """llama.cpp names for the issue-7 families (no q/k permutation: NEOX RoPE)."""
    t = {k: v.to(torch.float32).numpy() for k, v in hub.items()}
    out = {"token_embd.weight": t["model.embed_tokens.weight"]}
    if case["arch"] in ("deepseek2", "gpt-oss"):
        hub_to_gguf_deepseek_gptoss(t, case, c, out)
    for i in range(c["n_layer"] if case["arch"] not in ("deepseek2", "gpt-oss") else 0):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for gn, hn in FAMILY_ATTN.items():
            if p + hn in t:
                out[b + gn] = t[p + hn]
        if p + "mlp.experts.0.gate_proj.weight" in t:
            for gn, hn in FAMILY_EXPERTS:
                out[b + gn + ".weight"] = np.stack([t[f"{p}mlp.experts.{e}.{hn}.weight"]
                                                    for e in range(c["n_expert"])])
    out["output_norm.weight"] = t["model.norm.weight"]
    if not case["tied"]:
        out["output.weight"] = t["lm_head.weight"]
    return out


def gguf_to_hub_family(gt: dict, case: dict, c: dict) -> dict:
    h = {"model.embed_tokens.weight": gt["token_embd.weight"], "model.norm.weight": gt["output_norm.weight"]}
    if not case["tied"]:
        h["lm_head.weight"] = gt["output.weight"]
    if case["arch"] in ("deepseek2", "gpt-oss"):
        gguf_to_hub_deepseek_gptoss(gt, case, c, h)
    for i in range(c["n_layer"] if case["arch"] not in ("deepseek2", "gpt-oss") else 0):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for gn, hn in FAMILY_ATTN.items():
            if b + gn in gt:
                h[p + hn] = gt[b + gn]
        if b + "ffn_gate_exps.weight" in gt:
            for gn, hn in FAMILY_EXPERTS:
                for e in range(c["n_expert"]):
                    h[f"{p}mlp.experts.{e}.{hn}.weight"] = gt[b + gn + ".weight"][e]
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, copy=True)) for k, v in h.items()}


def hub_to_gguf_tensors(hub: dict, case: dict, c: dict) -> dict:
    """hub-named f32 numpy tensors -> GGUF-named f32 numpy arrays (numpy shape = reversed ne)."""
    if case["arch"] in FAMILY_ARCHS:
        return hub_to_gguf_tensors_family(hub, case, c)
    llama = case["arch"] == "llama"
    L, E = c["n_layer"], c["n_expert"]
    t = {k: v.to(torch.float32).numpy() for k, v in hub.items()}
    out = {"token_embd.weight": t["model.embed_tokens.weight"]}
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = t[p + "input_layernorm.weight"]
        q, k = t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"]
        if llama:
            q, k = permute_rope(q, c["n_head"]), permute_rope(k, c["n_head_kv"])
        out[b + "attn_q.weight"] = q
        out[b + "attn_k.weight"] = k
        out[b + "attn_v.weight"] = t[p + "self_attn.v_proj.weight"]
        out[b + "attn_output.weight"] = t[p + "self_attn.o_proj.weight"]
        if not llama:
            out[b + "attn_q_norm.weight"] = t[p + "self_attn.q_norm.weight"]
            out[b + "attn_k_norm.weight"] = t[p + "self_attn.k_norm.weight"]
        out[b + "ffn_norm.weight"] = t[p + "post_attention_layernorm.weight"]
        if llama:
            m = p + "block_sparse_moe."
            out[b + "ffn_gate_inp.weight"] = t[m + "gate.weight"]
            ex = [m + f"experts.{{e}}.{w}.weight" for w in ("w1", "w3", "w2")]
        else:
            m = p + "mlp."
            out[b + "ffn_gate_inp.weight"] = t[m + "gate.weight"]
            ex = [m + f"experts.{{e}}.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
        for name, pat in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), ex):
            out[b + name + ".weight"] = np.stack([t[pat.format(e=e)] for e in range(E)])
    out["output_norm.weight"] = t["model.norm.weight"]
    if not case["tied"]:
        out["output.weight"] = t["lm_head.weight"]
    return out


def gguf_to_hub(gt: dict, case: dict, c: dict) -> dict:
    if case["arch"] in FAMILY_ARCHS:
        return gguf_to_hub_family(gt, case, c)
    llama = case["arch"] == "llama"
    L, E = c["n_layer"], c["n_expert"]
    h = {"model.embed_tokens.weight": gt["token_embd.weight"], "model.norm.weight": gt["output_norm.weight"]}
    if not case["tied"]:
        h["lm_head.weight"] = gt["output.weight"]
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        h[p + "input_layernorm.weight"] = gt[b + "attn_norm.weight"]
        q, k = gt[b + "attn_q.weight"], gt[b + "attn_k.weight"]
        if llama:
            q, k = unpermute_rope(q, c["n_head"]), unpermute_rope(k, c["n_head_kv"])
        h[p + "self_attn.q_proj.weight"] = q
        h[p + "self_attn.k_proj.weight"] = k
        h[p + "self_attn.v_proj.weight"] = gt[b + "attn_v.weight"]
        h[p + "self_attn.o_proj.weight"] = gt[b + "attn_output.weight"]
        if not llama:
            h[p + "self_attn.q_norm.weight"] = gt[b + "attn_q_norm.weight"]
            h[p + "self_attn.k_norm.weight"] = gt[b + "attn_k_norm.weight"]
        h[p + "post_attention_layernorm.weight"] = gt[b + "ffn_norm.weight"]
        if llama:
            m = p + "block_sparse_moe."
            ex = [m + f"experts.{{e}}.{w}.weight" for w in ("w1", "w3", "w2")]
        else:
            m = p + "mlp."
            ex = [m + f"experts.{{e}}.{w}.weight" for w in ("gate_proj", "up_proj", "down_proj")]
        h[m + "gate.weight"] = gt[b + "ffn_gate_inp.weight"]
        for name, pat in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), ex):
            arr = gt[b + name + ".weight"]
            for e in range(E):
                h[pat.format(e=e)] = arr[e]
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, copy=True)) for k, v in h.items()}


# ----------------------------------------------------------------------------------------------
# numpy quantizers for the types gguf.quants can only DEQUANTIZE (Q2_K..Q6_K, IQ4_NL, IQ4_XS).
# Simple round-to-nearest encoders (not llama.cpp's search-based ones): they only have to produce
# VALID blocks close to the float weights; the bytes written define the weights, and every
# reference is computed from gguf.quants.dequantize of exactly those bytes. Each packer is the
# inverse of gguf.quants' unpacking (bits of group k along `axis` at shift k*bits); encode_blocks
# asserts that gguf's dequantize reproduces the intended d*scale*q (- dmin*m) values.
# ----------------------------------------------------------------------------------------------
QK_K = 256
IQ4_KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                       dtype=np.float32)


def _pack(codes: np.ndarray, shape: tuple, axis: int, bits: int) -> np.ndarray:
    """codes (nb, ...) -> reshape to (nb, *shape), OR the groups along `axis` (shift k*bits)."""
    nb = codes.shape[0]
    v = codes.astype(np.uint32).reshape((nb,) + shape)
    n = v.shape[axis]
    sh = (np.arange(n, dtype=np.uint32) * bits).reshape([-1 if i == axis else 1 for i in range(v.ndim)])
    return np.bitwise_or.reduce(v << sh, axis=axis).reshape(nb, -1)


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f16 bytes (nb, 2), the f16 value as float32 (nb, 1))"""
    h = np.asarray(x, dtype=np.float32).reshape(-1, 1).astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _nearest(x: np.ndarray, scale: np.ndarray, lo: int, hi: int, offset=None) -> np.ndarray:
    """round((x + offset) / scale) clipped to [lo, hi]; 0 where scale == 0"""
    num = x if offset is None else x + offset
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale != 0, np.rint(num / np.where(scale != 0, scale, 1)), 0)
    return np.clip(q, lo, hi).astype(np.int32)


def _affine_subblocks(x: np.ndarray, sub: int, qmax: int, smax: int):
    """x (nb, 256) -> sub-blocks with x ~= d*sc*q - dmin*m, q in [0,qmax], sc/m in [0,smax]."""
    nb = x.shape[0]
    xs = x.reshape(nb, -1, sub)
    mn = np.minimum(xs.min(-1), 0.0)                           # offset <= 0, as llama.cpp
    scale = (xs.max(-1) - mn) / qmax
    d_b, d = _f16(scale.max(-1) / smax)
    dmin_b, dmin = _f16((-mn).max(-1) / smax)
    sc = _nearest(scale, d, 0, smax)
    m = _nearest(-mn, dmin, 0, smax)
    dl, ml = d * sc, dmin * m                                   # (nb, n_sub), float32
    q = _nearest(xs, dl[..., None], 0, qmax, offset=ml[..., None])
    want = (dl[..., None] * q - ml[..., None]).reshape(nb, -1)
    return d_b, dmin_b, sc, m, q.reshape(nb, -1), want


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales + 8 six-bit mins -> 12 bytes (Q4_K / Q5_K layout)"""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint32)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _enc_q2_k(x):
    d_b, dmin_b, sc, m, q, want = _affine_subblocks(x, 16, 3, 15)
    scales = sc | (m << 4)
    qs = _pack(q, (2, 4, 32), 2, 2)
    return [scales, qs, d_b, dmin_b], want


def _enc_q4_k(x):
    d_b, dmin_b, sc, m, q, want = _affine_subblocks(x, 32, 15, 63)
    return [d_b, dmin_b, _pack_k_scales(sc, m), _pack(q, (4, 2, 32), 2, 4)], want


def _enc_q5_k(x):
    d_b, dmin_b, sc, m, q, want = _affine_subblocks(x, 32, 31, 63)
    qh = _pack(q >> 4, (1, 8, 32), 2, 1)
    ql = _pack(q & 15, (4, 2, 32), 2, 4)
    return [d_b, dmin_b, _pack_k_scales(sc, m), qh, ql], want


def _symmetric_subblocks(x: np.ndarray, sub: int, qlo: int, qhi: int, slo: int, shi: int):
    """x ~= d*sc*q, q in [qlo,qhi], signed integer sc in [slo,shi] (sub-block scale may be < 0)."""
    nb = x.shape[0]
    xs = x.reshape(nb, -1, sub)
    idx = np.abs(xs).argmax(-1)[..., None]
    peak = np.take_along_axis(xs, idx, -1)[..., 0]              # signed largest-magnitude value
    scale = peak / qlo                                          # maps the peak onto qlo (< 0)
    d_b, d = _f16(np.abs(scale).max(-1) / max(-slo, shi))
    sc = _nearest(scale, d, slo, shi)
    dl = d * sc
    q = _nearest(xs, dl[..., None], qlo, qhi)
    want = (dl[..., None] * q).reshape(nb, -1)
    return d_b, sc, q.reshape(nb, -1), want


def _enc_q3_k(x):
    d_b, sc, q, want = _symmetric_subblocks(x, 16, -4, 3, -32, 31)
    u = q + 4                                                   # 3-bit code: low 2 bits + hmask
    hmask = _pack(u >> 2, (1, 8, 32), 2, 1)
    qs = _pack(u & 3, (2, 4, 32), 2, 2)
    s6 = sc + 32
    scales = np.concatenate([_pack(s6 & 15, (2, 8), 1, 4), _pack(s6 >> 4, (4, 4), 1, 2)], axis=1)
    return [hmask, qs, scales, d_b], want


def _enc_q6_k(x):
    d_b, sc, q, want = _symmetric_subblocks(x, 16, -32, 31, -128, 127)
    u = q + 32
    ql = _pack(u & 15, (2, 2, 64), 2, 4)
    qh = _pack(u >> 4, (2, 4, 32), 2, 2)
    return [ql, qh, sc.astype(np.int8).view(np.uint8), d_b], want


def _iq4_codes(xs: np.ndarray, dl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    grid = dl[..., None] * IQ4_KVALUES                          # (..., 16) candidate values
    idx = np.abs(xs[..., None] - grid[..., None, :]).argmin(-1)
    return idx, np.take_along_axis(grid, idx, -1)


def _enc_iq4_nl(x):
    xs = x.reshape(-1, 32)                                      # 32-element blocks
    peak = np.take_along_axis(xs, np.abs(xs).argmax(-1)[:, None], -1)[:, 0]
    d_b, d = _f16(peak / -127.0)
    idx, want = _iq4_codes(xs, d[:, 0])
    return [d_b, _pack(idx, (1, 2, 16), 2, 4)], want


def _enc_iq4_xs(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    peak = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1)[..., 0]
    scale = peak / -127.0
    d_b, d = _f16(np.abs(scale).max(-1) / 32.0)
    ls = _nearest(scale, d, -32, 31)
    idx, want = _iq4_codes(xs, d * ls)
    s6 = ls + 32
    scales_h = _pack(s6 >> 4, (8,), 1, 2).astype(np.uint16).view(np.uint8).reshape(nb, 2)
    scales_l = _pack(s6 & 15, (4, 2), 2, 4)
    return [d_b, scales_h, scales_l, _pack(idx, (8, 2, 16), 2, 4)], want.reshape(nb, -1)


NUMPY_ENCODERS = {QT.Q2_K: _enc_q2_k, QT.Q3_K: _enc_q3_k, QT.Q4_K: _enc_q4_k, QT.Q5_K: _enc_q5_k,
                  QT.Q6_K: _enc_q6_k, QT.IQ4_NL: _enc_iq4_nl, QT.IQ4_XS: _enc_iq4_xs}


def encode_blocks(arr: np.ndarray, qt: QT) -> np.ndarray:
    """float32 (..., cols) -> uint8 (..., cols / block * type_size) blocks of `qt`."""
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    assert arr.shape[-1] % block == 0, (arr.shape, qt.name)
    x = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1, QK_K)
    parts, want = NUMPY_ENCODERS[qt](x)
    for p in parts:
        assert p.dtype == np.uint8 or (p.min() >= 0 and p.max() <= 255), qt.name
    raw = np.concatenate([p.astype(np.uint8) for p in parts], axis=1)
    raw = np.ascontiguousarray(raw.reshape(-1, tsize))
    out = raw.reshape(arr.shape[:-1] + (arr.shape[-1] // block * tsize,))
    # the packing must be exactly what gguf.quants unpacks
    deq = np.asarray(gguf.quants.dequantize(out, qt), np.float32).reshape(-1, QK_K)
    assert np.allclose(deq, want.reshape(-1, QK_K), rtol=1e-6, atol=1e-7), f"{qt.name}: packing mismatch"
    return out


def tensor_qtype(name: str, variant: str) -> QT:
    # norms (1-D) and the router (ffn_gate_inp) always stay F32, as llama.cpp's converter does
    if variant == "f32" or name.endswith("norm.weight") or "ffn_gate_inp" in name:
        return QT.F32
    if variant == "mixed":
        return MIXED_TYPES[name]
    if variant == "mxfp4":  # gpt-oss: routed expert matrices MXFP4 (as released), all else F32
        return QT.MXFP4 if name.endswith("_exps.weight") else QT.F32
    return VARIANT_QT[variant]


def quantize_tensor(arr: np.ndarray, qt: QT) -> np.ndarray:
    """float32 -> what write_gguf stores: float32 / float16 arrays, or uint8 blocks of `qt`."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if qt == QT.F32:
        return arr
    if qt == QT.F16:
        return arr.astype(np.float16)
    if qt in NUMPY_ENCODERS:
        return encode_blocks(arr, qt)
    return gguf.quants.quantize(arr, qt)  # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 MXFP4 BF16


def write_gguf(path: str, gt: dict, case: dict, c: dict, variant: str, name: str) -> dict:
    arch = case["arch"]
    w = gguf.GGUFWriter(path, arch)  # writes general.architecture; data alignment = default 32
    w.add_string("general.name", name)
    if variant in FILE_TYPE:  # no single llama_ftype describes the mixed file: key omitted
        w.add_uint32("general.file_type", FILE_TYPE[variant])
    A = arch
    w.add_uint32(f"{A}.block_count", c["n_layer"])
    w.add_uint32(f"{A}.context_length", c["n_ctx"])
    w.add_uint32(f"{A}.embedding_length", c["n_embd"])
    w.add_uint32(f"{A}.feed_forward_length", c["n_ff"])
    w.add_uint32(f"{A}.attention.head_count", c["n_head"])
    # deepseek2 as current llama.cpp writes it: the latent form is MQA (one kv head)
    latent_mqa = arch == "deepseek2" and case.get("gguf_kv_b") == "split"
    w.add_uint32(f"{A}.attention.head_count_kv", 1 if latent_mqa else c["n_head_kv"])
    w.add_float32(f"{A}.rope.freq_base", float(c["rope_theta"]))
    w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", float(c["rms_eps"]))
    w.add_uint32(f"{A}.expert_count", c["n_expert"])
    w.add_uint32(f"{A}.expert_used_count", c["n_expert_used"])
    if arch == "qwen2moe":  # as convert_hf_to_gguf.py: no expert_weights_norm (llama.cpp: off)
        w.add_uint32(f"{A}.expert_feed_forward_length", c["n_ff_exp"])
        w.add_uint32(f"{A}.expert_shared_feed_forward_length", c["n_ff_shared"])
    elif arch == "olmoe":  # feed_forward_length is the expert width; no renormalisation
        pass
    elif arch == "deepseek2":
        cfg = c["cfg"]
        w.add_uint32(f"{A}.leading_dense_block_count", cfg.first_k_dense_replace)
        w.add_uint32(f"{A}.vocab_size", c["n_vocab"])
        if cfg.q_lora_rank is not None:
            w.add_uint32(f"{A}.attention.q_lora_rank", cfg.q_lora_rank)
        w.add_uint32(f"{A}.attention.kv_lora_rank", cfg.kv_lora_rank)
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if latent_mqa:
            w.add_uint32(f"{A}.attention.key_length", cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            w.add_uint32(f"{A}.attention.value_length", cfg.kv_lora_rank)
            w.add_uint32(f"{A}.attention.key_length_mla", qk)
            w.add_uint32(f"{A}.attention.value_length_mla", cfg.v_head_dim)
        else:
            w.add_uint32(f"{A}.attention.key_length", qk)
            w.add_uint32(f"{A}.attention.value_length", cfg.v_head_dim)
        w.add_uint32(f"{A}.expert_feed_forward_length", cfg.moe_intermediate_size)
        w.add_uint32(f"{A}.expert_shared_count", cfg.n_shared_experts)
        w.add_float32(f"{A}.expert_weights_scale", float(cfg.routed_scaling_factor))
        if cfg.norm_topk_prob and case["model_type"] == "deepseek_v3":  # V2's router never renormalises
            w.add_bool(f"{A}.expert_weights_norm", True)
        w.add_uint32(f"{A}.expert_gating_func", 2 if case["model_type"] == "deepseek_v3" else 1)
        grouped = case["model_type"] == "deepseek_v3" or getattr(cfg, "topk_method", "") == "group_limited_greedy"
        if grouped and cfg.n_group is not None:
            w.add_uint32(f"{A}.expert_group_count", cfg.n_group)
            w.add_uint32(f"{A}.expert_group_used_count", cfg.topk_group)
        w.add_uint32(f"{A}.rope.dimension_count", cfg.qk_rope_head_dim)
        rp = cfg.rope_parameters
        if rp.get("rope_type", "default") == "yarn":
            w.add_string(f"{A}.rope.scaling.type", "yarn")
            w.add_float32(f"{A}.rope.scaling.factor", float(rp["factor"]))
            w.add_uint32(f"{A}.rope.scaling.original_context_length", int(rp["original_max_position_embeddings"]))
            if rp.get("mscale_all_dim"):
                w.add_float32(f"{A}.rope.scaling.yarn_log_multiplier", 0.1 * float(rp["mscale_all_dim"]))
    elif arch == "gpt-oss":
        cfg = c["cfg"]
        w.add_uint32(f"{A}.attention.key_length", c["head_dim"])
        w.add_uint32(f"{A}.attention.value_length", c["head_dim"])
        w.add_uint32(f"{A}.attention.sliding_window", cfg.sliding_window)
        w.add_uint32(f"{A}.expert_feed_forward_length", cfg.intermediate_size)
        rp = cfg.rope_parameters
        w.add_string(f"{A}.rope.scaling.type", "yarn")
        w.add_float32(f"{A}.rope.scaling.factor", float(rp["factor"]))
        w.add_uint32(f"{A}.rope.scaling.original_context_length", int(rp["original_max_position_embeddings"]))
    elif arch == "qwen3moe":
        w.add_uint32(f"{A}.expert_feed_forward_length", c["n_ff_exp"])
        w.add_uint32(f"{A}.attention.key_length", c["head_dim"])
        w.add_uint32(f"{A}.attention.value_length", c["head_dim"])
        w.add_bool(f"{A}.expert_weights_norm", bool(c["norm_topk_prob"]))
    else:
        w.add_uint32(f"{A}.rope.dimension_count", c["head_dim"])
        w.add_uint32(f"{A}.vocab_size", c["n_vocab"])
    types = {}
    for tname, arr in gt.items():
        qt = tensor_qtype(tname, variant)
        data = quantize_tensor(arr, qt)
        if qt in (QT.F32, QT.F16):
            w.add_tensor(tname, data)
        else:
            w.add_tensor(tname, data, raw_dtype=qt)
        types[tname] = qt.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types


def quant_roundtrip(gt: dict, variant: str) -> dict:
    out = {}
    for tn, arr in gt.items():
        qt = tensor_qtype(tn, variant)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qt == QT.F32:
            out[tn] = arr.copy()
        elif qt == QT.F16:
            out[tn] = arr.astype(np.float16).astype(np.float32)
        else:
            out[tn] = np.asarray(gguf.quants.dequantize(quantize_tensor(arr, qt), qt),
                                 dtype=np.float32).reshape(arr.shape)
    return out


def model_from_gguf_tensors(gt: dict, config, case: dict, c: dict):
    vm = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **impl_kwargs())
    vm.eval()
    load_model_sd(vm, hub_to_model_sd(gguf_to_hub(gt, case, c), case, c["n_layer"], c["n_expert"]),
                  case["tied"])
    return vm


def read_gguf_dequant(path: str) -> tuple[dict, dict]:
    r = gguf.GGUFReader(path)
    out, types = {}, {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(list(t.shape)))  # numpy order
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        out[t.name] = np.asarray(arr, dtype=np.float32).reshape(shape)
        types[t.name] = t.tensor_type.name
    return out, types


def ggml_reference_forward(path: str, tokens: list[int]) -> np.ndarray:
    """Independent float64 numpy forward that reads ONLY the GGUF file (metadata + dequantized
    tensors) and applies llama.cpp semantics: adjacent-pair RoPE for arch "llama", NEOX
    (rotate-half) RoPE for "qwen3moe", softmax -> top-k -> (optional) renormalise routing."""
    r = gguf.GGUFReader(path)

    def kv(key):
        f = r.fields[key]
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]][0]

    A = str(kv("general.architecture"))
    L, nh, nkv = int(kv(f"{A}.block_count")), int(kv(f"{A}.attention.head_count")), int(kv(f"{A}.attention.head_count_kv"))
    theta, eps = float(kv(f"{A}.rope.freq_base")), float(kv(f"{A}.attention.layer_norm_rms_epsilon"))
    k_used = int(kv(f"{A}.expert_used_count"))
    norm_w = bool(kv(f"{A}.expert_weights_norm")) if f"{A}.expert_weights_norm" in r.fields else True
    W = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(list(t.shape)))
        W[t.name] = np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), np.float64).reshape(shape)
    T = len(tokens)
    hd = W["blk.0.attn_q.weight"].shape[0] // nh

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # x [T, H, hd]
        if A == "llama":  # GGML_ROPE_TYPE_NORM: pairs (2j, 2j+1)
            a, b = x[..., 0::2], x[..., 1::2]
            return np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape)
        a, b = x[..., : hd // 2], x[..., hd // 2:]  # NEOX: pairs (j, j + hd/2)
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    x = W["token_embd.weight"][tokens]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        b = f"blk.{i}."
        h = rms(x, W[b + "attn_norm.weight"])
        q = (h @ W[b + "attn_q.weight"].T).reshape(T, nh, hd)
        k = (h @ W[b + "attn_k.weight"].T).reshape(T, nkv, hd)
        v = (h @ W[b + "attn_v.weight"].T).reshape(T, nkv, hd)
        if b + "attn_q_norm.weight" in W:
            q, k = rms(q, W[b + "attn_q_norm.weight"]), rms(k, W[b + "attn_k_norm.weight"])
        q, k = rope(q), rope(k)
        o = np.empty((T, nh, hd))
        for hh in range(nh):
            kh = hh // (nh // nkv)
            s = q[:, hh] @ k[:, kh].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kh]
        x = x + o.reshape(T, nh * hd) @ W[b + "attn_output.weight"].T
        h = rms(x, W[b + "ffn_norm.weight"])
        lg = h @ W[b + "ffn_gate_inp.weight"].T
        p = np.exp(lg - lg.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        y = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-p[t], kind="stable")[:k_used]
            wts = p[t, top] / (p[t, top].sum() if norm_w else 1.0)
            for e, wt in zip(top, wts):
                g = W[b + "ffn_gate_exps.weight"][e] @ h[t]
                u = W[b + "ffn_up_exps.weight"][e] @ h[t]
                y[t] += wt * (W[b + "ffn_down_exps.weight"][e] @ (g / (1 + np.exp(-g)) * u))
        x = x + y
    x = rms(x, W["output_norm.weight"])
    return x @ W.get("output.weight", W["token_embd.weight"]).T


# ----------------------------------------------------------------------------------------------
# Per-case driver
# ----------------------------------------------------------------------------------------------
def hparams(model, case, theta) -> dict:
    cfg = model.config
    return dict(
        n_layer=cfg.num_hidden_layers, n_ctx=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
        n_ff=cfg.intermediate_size,
        n_ff_exp=getattr(cfg, "moe_intermediate_size", cfg.intermediate_size),
        n_head=cfg.num_attention_heads, n_head_kv=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, n_vocab=cfg.vocab_size, rope_theta=theta, rms_eps=cfg.rms_norm_eps,
        n_expert=case["cfg"].get("num_experts", case["cfg"].get("num_local_experts",
                                                               case["cfg"].get("n_routed_experts"))),
        qk_nope=getattr(cfg, "qk_nope_head_dim", 0), v_head=getattr(cfg, "v_head_dim", 0), cfg=cfg,
        n_expert_used=cfg.num_experts_per_tok,
        norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", True)),
        n_ff_shared=getattr(cfg, "shared_expert_intermediate_size", 0),
    )


def write_f32_bin(path: str, t: torch.Tensor):
    np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4")).tofile(path)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max().item() / max(b.abs().max().item(), 1e-30))


def run_case(name: str, case: dict, out_root: str) -> dict:
    case_dir = os.path.join(out_root, name)
    if os.path.isdir(case_dir):
        shutil.rmtree(case_dir)
    os.makedirs(case_dir)
    keep_hf = case.get("keep_hf", True)
    # not kept: written to (and reloaded from) a temporary folder, so the same checks run
    hf_dir = os.path.join(case_dir, "hf") if keep_hf else tempfile.mkdtemp(prefix=f"golden-{name}-hf-")
    top_k = case["cfg"]["num_experts_per_tok"]

    # ---- 1. draw a decisive model + prompt (deterministic seed search) ----------------------
    for attempt in range(MAX_ATTEMPTS):
        seed = case["seed"] + attempt
        model = build_model(case, seed)
        rng = np.random.default_rng(seed)
        prompt = [int(x) for x in rng.integers(0, COMMON["vocab_size"], size=N_PROMPT)]
        tokens, ggap = greedy(model, prompt, N_GEN)
        rgap, sel = router_stats(model, tokens, top_k)
        tf_gap = top_gap(forward_logits(model, tokens))
        if rgap < MIN_ROUTER_GAP or ggap < MIN_GREEDY_GAP:
            continue
        if len(set(tokens[N_PROMPT:])) < MIN_DISTINCT_GEN:  # avoid a degenerate "x x x x" run
            continue
        # the quantized variants (in-memory quantize->dequantize, same bytes as written below)
        # must route every token to the same experts, with the same decisiveness margin
        _, theta = make_config(case)
        c = hparams(model, case, theta)
        hub0 = model_sd_to_hub(model.state_dict(), case)
        ok = True
        for variant in case["variants"]:
            if variant == "f32":
                continue
            vm = model_from_gguf_tensors(quant_roundtrip(hub_to_gguf_tensors(hub0, case, c), variant),
                                         model.config, case, c)
            vgap, vsel = router_stats(vm, tokens, top_k)
            if vgap < MIN_ROUTER_GAP or (case.get("same_routing", True) and not same_selection(sel, vsel)):
                ok = False
                break
        if ok:
            break
    else:
        raise RuntimeError(f"{name}: no decisive seed found")

    # ---- 2. write HF folder, reload, assert exact equality ----------------------------------
    hub, rope_spelling, hf_files = write_hf(hf_dir, model, case, theta)
    ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, **impl_kwargs())
    ref.eval()
    rcfg = ref.config
    assert type(ref).__name__ == case["cls"], type(ref).__name__
    assert rcfg.tie_word_embeddings == case["tied"]
    if case["tied"]:
        assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()
    rp = getattr(rcfg, "rope_parameters", None) or {}
    assert float(rp.get("rope_theta", getattr(rcfg, "rope_theta", -1))) == float(theta), rp
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), f"reloaded weight differs: {k}"
    tokens_ref, _ = greedy(ref, prompt, N_GEN)
    assert tokens_ref == tokens, "greedy continuation differs after reload"
    logits_mem = forward_logits(model, tokens)
    logits = forward_logits(ref, tokens)
    assert torch.equal(logits_mem, logits), "reloaded model logits != in-memory logits"
    # teacher-forced argmax == greedy continuation
    assert [int(x) for x in logits[N_PROMPT - 1:-1].argmax(-1)] == tokens[N_PROMPT:]

    _, ref_sel = router_stats(ref, tokens, top_k)
    assert same_selection(ref_sel, sel)
    np.asarray(tokens, dtype="<i4").tofile(os.path.join(case_dir, "tokens.bin"))
    write_f32_bin(os.path.join(case_dir, "logits.bin"), logits)

    # ---- 3. GGUF variants -------------------------------------------------------------------
    hub_f32 = {k: v.to(torch.float32) for k, v in hub.items()}
    gt = hub_to_gguf_tensors(hub_f32, case, c)
    variants = {}
    for variant in case["variants"]:
        fn = f"model-{variant}.gguf"
        path = os.path.join(case_dir, fn)
        types = write_gguf(path, gt, case, c, variant, f"strata-golden-{name}")
        deq, rtypes = read_gguf_dequant(path)
        assert rtypes == types and set(deq) == set(gt)
        for tn in gt:
            assert deq[tn].shape == gt[tn].shape, (tn, deq[tn].shape, gt[tn].shape)
        mem = quant_roundtrip(gt, variant)
        for tn in gt:
            assert np.array_equal(deq[tn], mem[tn]), f"file dequant != in-memory dequant: {tn}"
        vm = model_from_gguf_tensors(deq, ref.config, case, c)
        vlog = forward_logits(vm, tokens)
        err = rel_err(vlog, logits)
        vgap, vsel = router_stats(vm, tokens, top_k)
        same_sel = same_selection(vsel, ref_sel)
        assert same_sel or not case.get("same_routing", True), f"{name}/{fn}: expert selection differs from f32"
        assert vgap >= MIN_ROUTER_GAP, (name, fn, vgap)
        exact_weights = variant == "f32" or case["store_dtype"] == "bfloat16"
        info = dict(file=fn, logits_file="logits.bin", rel_err_vs_logits_bin=err,
                    router_min_gap=vgap, same_expert_selection_as_reference=same_sel,
                    argmax_agree_with_logits_bin=float(
                        (vlog.argmax(-1) == logits.argmax(-1)).float().mean().item()),
                    tensor_types=sorted(set(types.values())),
                    size_bytes=os.path.getsize(path))
        if variant == "mixed":
            # every matrix's type, and the weights' own rounding error (max|deq - w| / max|w|)
            info["tensor_type_map"] = {tn: types[tn] for tn in gt}
            # fraction of (layer, token) whose top-k expert set equals the f32 model's
            info["expert_selection_agreement_with_reference"] = float(np.mean(
                [torch.equal(a[t], b[t]) for a, b in zip(vsel, ref_sel) for t in range(a.shape[0])]))
            info["weight_rel_err"] = {tn: float(np.abs(deq[tn] - gt[tn]).max() / np.abs(gt[tn]).max())
                                      for tn in gt if types[tn] != "F32"}
            assert set(MIXED_ALL_TYPES) <= set(types.values())
        # independent GGML-semantics forward straight from the GGUF file (original families only)
        if case["arch"] not in FAMILY_ARCHS:
            ggml = torch.from_numpy(ggml_reference_forward(path, tokens)).float()
            info["ggml_numpy_ref_rel_err"] = rel_err(ggml, vlog)
            assert info["ggml_numpy_ref_rel_err"] <= 1e-4, (name, fn, info["ggml_numpy_ref_rel_err"])
        if exact_weights:
            # f32 GGUF (or bf16 GGUF of bf16 weights) must reproduce logits.bin
            assert err <= 1e-6, f"{name}/{fn}: GGUF round-trip rel err {err}"
        if variant != "f32":
            lf = f"logits-{variant}.bin"
            write_f32_bin(os.path.join(case_dir, lf), vlog)
            info["logits_file"] = lf
        variants[variant] = info

    # ---- 4. meta.json -----------------------------------------------------------------------
    cfgj = json.load(open(os.path.join(hf_dir, "config.json")))
    if not keep_hf:
        shutil.copyfile(os.path.join(hf_dir, "config.json"), os.path.join(case_dir, "config.json"))
        shutil.rmtree(hf_dir)
        hf_files = []
    meta = dict(
        case=name,
        arch=case["arch"], hf_model_type=case["model_type"], hf_class=case["cls"],
        dtype=case["store_dtype"], compute_dtype="float32",
        n_prompt=N_PROMPT, n_gen=N_GEN, n_tokens=len(tokens), n_vocab=c["n_vocab"],
        tokens=tokens,
        seed=seed, seed_attempts=attempt + 1,
        rope_spelling=rope_spelling,
        expert_count_spelling=("num_experts" if "num_experts" in cfgj else "num_local_experts"),
        hf_files=hf_files, hf_sharded=case["shards"] > 1,
        tied_word_embeddings=case["tied"],
        config=dict(
            hidden_size=c["n_embd"], num_hidden_layers=c["n_layer"],
            num_attention_heads=c["n_head"], num_key_value_heads=c["n_head_kv"],
            head_dim=c["head_dim"], intermediate_size=c["n_ff"],
            moe_intermediate_size=c["n_ff_exp"], num_experts=c["n_expert"],
            num_experts_per_tok=c["n_expert_used"], norm_topk_prob=c["norm_topk_prob"],
            vocab_size=c["n_vocab"], max_position_embeddings=c["n_ctx"],
            rope_theta=theta, rms_norm_eps=c["rms_eps"], attention_bias=False,
            hidden_act="silu",
        ),
        checks=dict(
            reload_logits_equal=True, reload_weights_equal=True,
            greedy_min_top1_gap=ggap, teacher_forced_min_top1_gap=tf_gap,
            router_min_topk_gap=rgap,
            logits_absmax=float(logits.abs().max().item()), logits_std=float(logits.std().item()),
        ),
        gguf_variants=variants,
        gguf_notes=("general.alignment not written (default 32); no tokenizer metadata; "
                    "norms and ffn_gate_inp always F32; "
                    + ("attn_q/attn_k rows permuted for adjacent-pair RoPE (llama convention)"
                       if case["arch"] == "llama" else "no q/k permutation (NEOX RoPE)")),
        versions=dict(transformers=transformers.__version__, torch=torch.__version__,
                      numpy=np.__version__, gguf=getattr(gguf, "__version__", None) or _gguf_version(),
                      safetensors=safetensors.__version__, python=sys.version.split()[0]),
        hf_config_keys_of_note={k: cfgj.get(k) for k in (
            "rope_theta", "rope_parameters", "num_local_experts", "num_experts",
            "tie_word_embeddings", "norm_topk_prob", "torch_dtype", "dtype") if k in cfgj},
    )
    if case["arch"] in ("deepseek2", "gpt-oss"):
        meta["feature_effects_rel_err"] = feature_effects(ref, case, tokens, logits)
    with open(os.path.join(case_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    size = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(case_dir) for fn in fns)
    return dict(name=name, seed=seed, attempts=attempt + 1, size=size, ggap=ggap, rgap=rgap,
                absmax=meta["checks"]["logits_absmax"], variants=variants, rope=rope_spelling)


@torch.no_grad()
def feature_effects(model, case: dict, tokens: list[int], logits: torch.Tensor) -> dict:
    """How much each family feature moves the logits (rel. error when it is switched off in a copy of
    the reference model): evidence that the golden exercises it, so an engine ignoring it fails."""
    import copy
    out = {}

    def effect(name, mutate):
        m = copy.deepcopy(model)
        mutate(m)
        out[name] = rel_err(forward_logits(m, tokens), logits)

    mt = case["model_type"]
    if mt == "gpt_oss":
        def no_clamp(m):
            for layer in m.model.layers:
                layer.mlp.experts.limit = 1e9
        effect("swiglu_clamp", no_clamp)
        effect("attention_sinks", lambda m: [l.self_attn.sinks.fill_(-1e9) for l in m.model.layers])
        def full_attention(m):
            m.config.layer_types = ["full_attention"] * len(m.model.layers)
            for layer in m.model.layers:
                layer.self_attn.sliding_window = None
        effect("sliding_window", full_attention)
        effect("expert_biases", lambda m: [(l.mlp.experts.gate_up_proj_bias.zero_(),
                                            l.mlp.experts.down_proj_bias.zero_()) for l in m.model.layers])
    if mt == "deepseek_v3":
        effect("selection_bias", lambda m: [l.mlp.gate.e_score_correction_bias.zero_()
                                            for l in m.model.layers if hasattr(l.mlp, "gate")])
    if mt == "deepseek_v3" or getattr(model.config, "topk_method", "") == "group_limited_greedy":
        def all_groups(m):
            for l in m.model.layers:
                if hasattr(l.mlp, "gate"):
                    l.mlp.gate.topk_group = l.mlp.gate.num_group
        effect("group_limited_selection", all_groups)
    if mt in ("deepseek_v2", "deepseek_v3"):
        def unit_scale(m):
            for l in m.model.layers:
                if hasattr(l.mlp, "gate"):
                    l.mlp.gate.routed_scaling_factor = 1.0
        effect("routed_scaling_factor", unit_scale)
    if "rope" in case:
        def plain_rope(m):
            inv = 1.0 / (m.config.rope_parameters["rope_theta"] ** (
                torch.arange(0, m.model.rotary_emb.inv_freq.numel() * 2, 2, dtype=torch.float)
                / (m.model.rotary_emb.inv_freq.numel() * 2)))
            m.model.rotary_emb.inv_freq.copy_(inv)
            m.model.rotary_emb.attention_scaling = 1.0
        effect("yarn_frequencies", plain_rope)
    return out


def _gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--only", default=None, help="comma-separated cases (same as --cases)")
    args = ap.parse_args()
    if args.only:
        args.cases = args.only
    os.makedirs(args.out, exist_ok=True)

    check_rope_permutation(16, 4, 1e4)
    check_rope_permutation(16, 2, 1e4)

    rows = []
    for name in args.cases.split(","):
        print(f"[golden] {name} ...", flush=True)
        rows.append(run_case(name, CASES[name], args.out))

    print()
    print(f"transformers {transformers.__version__}  torch {torch.__version__}  numpy {np.__version__}"
          f"  gguf {_gguf_version()}")
    print("GGUF: every variant also re-computed by an independent float64 numpy forward "
          "(llama.cpp semantics) from the .gguf alone; max rel err vs HF: "
          + ", ".join(f"{r['name']}/{v}={i.get('ggml_numpy_ref_rel_err', float('nan')):.1e}"
                      for r in rows for v, i in r["variants"].items()))
    print(f"{'case':<15} {'seed':>5} {'try':>3} {'size':>9} {'|logit|max':>10} {'greedy_gap':>10} "
          f"{'router_gap':>10} {'rope':<16} variant: rel_err vs logits.bin / argmax agree")
    for r in rows:
        vs = "  ".join(f"{v}:{i['rel_err_vs_logits_bin']:.2e}/{i['argmax_agree_with_logits_bin']:.2f}"
                       for v, i in r["variants"].items())
        print(f"{r['name']:<15} {r['seed']:>5} {r['attempts']:>3} {r['size']:>9} {r['absmax']:>10.3f} "
              f"{r['ggap']:>10.4f} {r['rgap']:>10.4f} {r['rope']:<16} {vs}")
    total = sum(r["size"] for r in rows)
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
