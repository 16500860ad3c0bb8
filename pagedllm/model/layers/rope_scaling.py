"""RoPE parameters from an HF config, user overrides, and inverse frequencies per scaling type.

Every formula reproduces `transformers.modeling_rope_utils` operation for operation (same
fp32/fp64 steps in the same order), so the frequencies are bit-identical to HF's: at position
16k an inv_freq off by one fp32 ulp already moves the angle by ~1e-3 rad.

Two config layouts are read:

    transformers >= 5   config.rope_parameters = {"rope_type", "rope_theta", "factor", ...}
    transformers <  5   config.rope_scaling = {"type" | "rope_type", "factor", ...}
                        config.rope_theta = 10000.0
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
_REQUIRED_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (),  # factor may be left out: HF then uses max_position_embeddings / original
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}
# HF fills original_max_position_embeddings for these
_WITH_ORIGINAL_LEN = ("yarn", "llama3", "longrope")
# Frequencies that depend on the length a sequence reaches (rotary.RotaryEmbedding.is_dynamic)
LENGTH_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")
DEFAULT_THETA = 10000.0
_FULL = "full_attention"


def parse_rope_scaling(value: dict | str | None) -> dict | None:
    """Normalize a user's rope scaling (dict or JSON text): `type` -> `rope_type`, checked."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"rope_scaling is not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"rope_scaling must be a JSON object, got {value!r}")
    params = dict(value)
    params["rope_type"] = params.pop("type", None) or params.get("rope_type") or "default"
    validate_rope_parameters(params)
    return params


def validate_rope_parameters(params: dict) -> None:
    """Raise ValueError for an unsupported rope_type or a missing/invalid required key."""
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    missing = [k for k in _REQUIRED_KEYS[rope_type] if params.get(k) is None]
    if missing:
        raise ValueError(f"rope scaling {rope_type!r} needs {', '.join(missing)}; got {params}")
    factor = params.get("factor")
    if rope_type != "default" and factor is not None and (
            not isinstance(factor, int | float) or factor < 1.0):
        raise ValueError(f"rope scaling factor must be a number >= 1, got {factor!r}")
    theta = params.get("rope_theta")
    if theta is not None and (not isinstance(theta, int | float) or theta <= 0):
        raise ValueError(f"rope_theta must be a positive number, got {theta!r}")


def rope_parameters(config) -> dict:
    """A standalone, normalized copy of the config's RoPE settings (HF `standardize` rules).

    Keys: rope_type, rope_theta, the type's own keys (factor, ...), partial_rotary_factor if
    set, and original_max_position_embeddings for yarn/llama3 (defaulting as HF does).
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    if isinstance(params.get(_FULL), dict):
        # Per-layer-type RoPE (Gemma 3): the full-attention layers set the context length.
        params = dict(params[_FULL])
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
    params["rope_type"] = params.pop("type", None) or params.get("rope_type") or "default"
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(config, "rope_theta", None) or DEFAULT_THETA
    partial = getattr(config, "partial_rotary_factor", None)
    if partial is not None:
        params.setdefault("partial_rotary_factor", partial)
    factors = getattr(config, "rope_freq_factors", None)
    if factors is not None:  # llama.cpp's per-frequency divisors (a GGUF's rope_freqs)
        params["freq_factors"] = [float(f) for f in factors]
    if params["rope_type"] in _WITH_ORIGINAL_LEN:
        top_level = getattr(config, "original_max_position_embeddings", None)
        if top_level is not None:  # Phi3-style configs keep it outside; HF gives it priority
            params["original_max_position_embeddings"] = top_level
        params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    validate_rope_parameters(params)
    return params


def layer_type_rope_parameters(config, layer_type: str) -> dict:
    """RoPE settings of the layers of `layer_type` ("full_attention" / "sliding_attention").

    transformers 5 nests them per layer type (Gemma 3: 1M base for full layers, 10k for
    sliding ones); older configs give the sliding base as `rope_local_base_freq`.
    """
    nested = getattr(config, "rope_parameters", None) or {}
    if isinstance(nested.get(layer_type), dict):
        params = dict(nested[layer_type])
    elif layer_type != _FULL and getattr(config, "rope_local_base_freq", None) is not None:
        params = {"rope_type": "default", "rope_theta": float(config.rope_local_base_freq)}
    else:
        return rope_parameters(config)
    shim = SimpleNamespace(rope_parameters=params, rope_scaling=None, rope_theta=None,
                           partial_rotary_factor=getattr(config, "partial_rotary_factor", None),
                           original_max_position_embeddings=getattr(
                               config, "original_max_position_embeddings", None),
                           max_position_embeddings=config.max_position_embeddings)
    return rope_parameters(shim)


def apply_rope_overrides(config, rope_scaling: dict | None, rope_theta: float | None) -> None:
    """Write user overrides into the HF config before the model is built.

    `rope_scaling` replaces the scaling entirely (rope_theta and partial_rotary_factor are kept
    unless it names them); `{"rope_type": "default"}` turns scaling off. `rope_theta` replaces
    the base. Both layouts are written so HF code reading either one sees the same values.
    """
    if rope_scaling is None and rope_theta is None:
        return
    if isinstance((getattr(config, "rope_parameters", None) or {}).get(_FULL), dict):
        raise ValueError("rope_scaling / rope_theta overrides are not supported for models "
                         "with per-layer-type RoPE settings (Gemma 3)")
    current = rope_parameters(config)
    if rope_scaling is not None:
        params = {k: current[k] for k in ("rope_theta", "partial_rotary_factor") if k in current}
        params.update(parse_rope_scaling(rope_scaling) or {})
    else:
        params = current
    if rope_theta is not None:
        params["rope_theta"] = float(rope_theta)
    if params["rope_type"] in _WITH_ORIGINAL_LEN:
        params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
    validate_rope_parameters(params)
    config.rope_parameters = params
    if "rope_theta" in vars(config):  # transformers < 5 layout
        config.rope_theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        config.rope_scaling = None if params["rope_type"] == "default" else scaling


def rope_max_len(config) -> tuple[int, str]:
    """(the longest context the model's RoPE supports, how that number was derived).

    Without scaling: max_position_embeddings. With scaling: the larger of that and
    original_max_position_embeddings x factor (llama3 checkpoints already state the scaled
    length in max_position_embeddings; linear/dynamic ones state the original).
    """
    mpe = int(config.max_position_embeddings)
    params = rope_parameters(config)
    if params["rope_type"] == "default":
        return mpe, f"max_position_embeddings={mpe}, no rope scaling"
    original = int(params.get("original_max_position_embeddings") or mpe)
    factor = params.get("factor") or mpe / original
    scaled = int(original * float(factor))
    how = (f"{params['rope_type']} rope scaling: original length {original} x factor "
           f"{factor} = {scaled}, max_position_embeddings={mpe}")
    return max(mpe, scaled), how


def rotary_dim(head_dim: int, params: dict) -> int:
    return int(head_dim * params.get("partial_rotary_factor", 1.0))


def compute_inv_freq(dim: int, params: dict, max_position_embeddings: int,
                     seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim/2] fp32 on CPU, attention factor multiplying cos/sin).

    `seq_len` only matters for "dynamic" and "longrope": the sequence length the frequencies
    are for (None or <= the original maximum: the unscaled / short-factor frequencies).
    """
    rope_type = params.get("rope_type", "default")
    base = params["rope_theta"]
    if rope_type == "dynamic":
        return _dynamic(dim, base, float(params["factor"]), max_position_embeddings, seq_len), 1.0
    if rope_type == "longrope":
        return _longrope(dim, base, params, max_position_embeddings, seq_len)
    if rope_type == "yarn":
        return _yarn(dim, base, params, max_position_embeddings)
    inv_freq = _default(dim, base)
    if rope_type == "linear":
        inv_freq /= params["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3(inv_freq, params)
    if params.get("freq_factors") is not None:
        inv_freq = _divided(inv_freq, params["freq_factors"])
    return inv_freq, 1.0


def _divided(inv_freq: torch.Tensor, factors: list[float]) -> torch.Tensor:
    """Frequencies divided by llama.cpp's `rope_freqs` factors (how a Llama-3.1 GGUF carries
    its llama3 scaling: the converter computes one factor per frequency)."""
    if len(factors) != inv_freq.shape[0]:
        raise ValueError(f"rope_freqs has {len(factors)} factors; the rotary dimension needs "
                         f"{inv_freq.shape[0]}")
    return inv_freq / torch.tensor(factors, dtype=torch.float32)


def _default(dim: int, base) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _dynamic(dim: int, base: float, factor: float, max_len: int,
             seq_len: int | None) -> torch.Tensor:
    """NTK-aware base rescaling for a sequence of `seq_len` tokens.

    HF computes the initial (short-sequence) frequencies with a Python int length and the
    grown ones with a 0-dim int64 tensor (`max(position_ids) + 1`); both paths are kept so
    each matches bit for bit.
    """
    if seq_len is None or seq_len <= max_len:
        scaled_base = base * ((factor * max_len / max_len) - (factor - 1)) ** (dim / (dim - 2))
        return _default(dim, scaled_base)
    length = torch.tensor(seq_len, dtype=torch.int64)
    scaled_base = base * ((factor * length / max_len) - (factor - 1)) ** (dim / (dim - 2))
    return _default(dim, scaled_base)


def _longrope(dim: int, base: float, cfg: dict, max_position_embeddings: int,
              seq_len: int | None) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3 / Phi-4): per-frequency divisors, `long_factor` for a sequence longer
    than original_max_position_embeddings, else `short_factor`; cos/sin scaled by
    sqrt(1 + ln(factor) / ln(original)) unless `attention_factor` is given."""
    original = cfg["original_max_position_embeddings"]
    factor = cfg.get("factor")
    if factor is None:  # Phi-3 states the extended length in max_position_embeddings
        factor = max_position_embeddings / original
    attention_factor = cfg.get("attention_factor")
    if attention_factor is None:
        attention_factor = (1.0 if factor <= 1.0
                            else math.sqrt(1 + math.log(factor) / math.log(original)))
    ext = cfg["long_factor"] if seq_len and seq_len > original else cfg["short_factor"]
    if len(ext) != dim // 2:
        raise ValueError(f"longrope factors must have rotary_dim / 2 = {dim // 2} entries; got "
                         f"{len(ext)}")
    ext_factors = torch.tensor(ext, dtype=torch.float32)
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext_factors * base**inv_freq_shape), attention_factor


def _yarn(dim: int, base: float, cfg: dict, max_position_embeddings: int
          ) -> tuple[torch.Tensor, float]:
    original = cfg["original_max_position_embeddings"]
    factor = cfg.get("factor") or max_position_embeddings / original
    attention_factor = cfg.get("attention_factor")
    mscale, mscale_all_dim = cfg.get("mscale"), cfg.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = cfg.get("beta_fast") or 32
    beta_slow = cfg.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if cfg.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a division by zero in the ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return inv_freq, attention_factor


def _llama3(inv_freq: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Llama 3.1 smoothing: long wavelengths / factor, short kept, a linear blend between."""
    factor = cfg["factor"]
    low = cfg["low_freq_factor"]
    high = cfg["high_freq_factor"]
    old_len = cfg["original_max_position_embeddings"]
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)
