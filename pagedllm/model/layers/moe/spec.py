"""A checkpoint's mixture-of-experts shape, read from its HF config (or config.json).

One table of the families' config fields, used by the models (which layers are sparse, how
they route) and by `pagedllm plan` / the start-up log (total vs active parameters):

    family      experts              width                    router                shared
    mixtral     num_local_experts    intermediate_size        softmax, renormalized  -
    qwen2_moe   num_experts          moe_intermediate_size    norm_topk_prob         sigmoid-gated
    qwen3_moe   num_experts (*)      moe_intermediate_size    norm_topk_prob         -
    olmoe       num_experts          intermediate_size        norm_topk_prob         -
    deepseek_v2 n_routed_experts     moe_intermediate_size    softmax, grouped (**)  n_shared_experts
    deepseek_v3 n_routed_experts     moe_intermediate_size    sigmoid + bias, grouped n_shared_experts

(*) transformers 5 writes `num_local_experts`; Hub checkpoints `num_experts`. Qwen layers in
`mlp_only_layers`, or not on the `decoder_sparse_step`, have a dense MLP of
`intermediate_size`. DeepSeek layers before `first_k_dense_replace` are dense; its shared
experts are one ungated MLP of n_shared_experts x moe_intermediate_size.
(**) group_limited_greedy when `topk_method` says so, else plain top-k; V2 is never
renormalized (HF transformers ignores its norm_topk_prob).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.model.layers.moe.router import RouterSpec

MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3")
DEEPSEEK = ("deepseek_v2", "deepseek_v3")


@dataclass(frozen=True)
class MoESpec:
    router: RouterSpec
    hidden_size: int
    intermediate_size: int  # of one routed expert
    sparse_layers: tuple[bool, ...]  # per layer: MoE block (True) or dense MLP
    dense_intermediate_size: int = 0  # of the dense layers' MLP
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_expert_gate: bool = False  # sigmoid(x W) scales the shared expert
    expert_bias: bool = False  # DeepSeek-V3's e_score_correction_bias steers the choice

    @property
    def num_experts(self) -> int:
        return self.router.num_experts

    @property
    def top_k(self) -> int:
        return self.router.top_k

    @classmethod
    def from_config(cls, cfg) -> MoESpec | None:
        """The spec of a MoE family's config (an HF config or a config.json namespace);
        None for a dense model."""
        family = getattr(cfg, "model_type", None)
        if family not in MOE_FAMILIES:
            return None
        if family in DEEPSEEK:
            return cls._deepseek(cfg)
        layers = cfg.num_hidden_layers
        if family == "mixtral":
            experts, renorm = cfg.num_local_experts, True
        else:
            experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
            renorm = bool(getattr(cfg, "norm_topk_prob", False))
        sparse = [True] * layers
        if family in ("qwen2_moe", "qwen3_moe"):
            step = getattr(cfg, "decoder_sparse_step", 1) or 1
            dense_only = set(getattr(cfg, "mlp_only_layers", None) or [])
            sparse = [i not in dense_only and (i + 1) % step == 0 for i in range(layers)]
        shared = (
            getattr(cfg, "shared_expert_intermediate_size", 0) or 0 if family == "qwen2_moe" else 0
        )
        return cls(
            router=RouterSpec(experts, cfg.num_experts_per_tok, renormalize=renorm),
            hidden_size=cfg.hidden_size,
            intermediate_size=getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size,
            sparse_layers=tuple(sparse),
            dense_intermediate_size=cfg.intermediate_size,
            shared_intermediate_size=shared,
            shared_expert_gate=shared > 0,
        )

    @classmethod
    def _deepseek(cls, cfg) -> MoESpec:
        v3 = cfg.model_type == "deepseek_v3"
        experts = cfg.n_routed_experts
        grouped = v3 or getattr(cfg, "topk_method", "greedy") == "group_limited_greedy"
        router = RouterSpec(
            experts,
            cfg.num_experts_per_tok,
            scoring="sigmoid" if v3 else "softmax",
            renormalize=v3 and bool(getattr(cfg, "norm_topk_prob", False)),
            num_groups=(cfg.n_group or 1) if grouped else 1,
            topk_groups=(cfg.topk_group or 1) if grouped else 1,
            scale=float(cfg.routed_scaling_factor),
            group_score="top2" if v3 else "max",
        )
        dense = cfg.first_k_dense_replace or 0
        return cls(
            router=router,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.moe_intermediate_size,
            sparse_layers=tuple(i >= dense for i in range(cfg.num_hidden_layers)),
            dense_intermediate_size=cfg.intermediate_size,
            shared_intermediate_size=cfg.moe_intermediate_size * (cfg.n_shared_experts or 0),
            expert_bias=v3,
        )

    def mlp_parameters(self) -> tuple[int, int]:
        """(total, active per token) parameters of all layers' MLPs (routers, routed and
        shared experts, dense MLPs)."""
        h = self.hidden_size
        expert = 3 * h * self.intermediate_size
        fixed = (
            h * self.num_experts
            + 3 * h * self.shared_intermediate_size
            + (h if self.shared_expert_gate else 0)
        )
        sparse = sum(self.sparse_layers)
        dense = (len(self.sparse_layers) - sparse) * 3 * h * self.dense_intermediate_size
        total = dense + sparse * (fixed + self.num_experts * expert)
        active = dense + sparse * (fixed + self.top_k * expert)
        return total, active

    def expert_parameters(self) -> int:
        """Parameters of the routed experts (all layers)."""
        return (
            sum(self.sparse_layers)
            * self.num_experts
            * 3
            * self.hidden_size
            * (self.intermediate_size)
        )

    def describe(self) -> str:
        """One line for logs: experts, top-k, width, shared expert, sparse layers."""
        shared = (
            f", a shared expert of width {self.shared_intermediate_size}"
            if self.shared_intermediate_size
            else ""
        )
        return (
            f"{self.num_experts} experts of width {self.intermediate_size}, top-"
            f"{self.top_k}{shared}, on {sum(self.sparse_layers)} of "
            f"{len(self.sparse_layers)} layers"
        )
