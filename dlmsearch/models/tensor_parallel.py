"""Tensor parallelism: one loaded model sharded over a group of ``model.tensor_parallel`` processes.

Under ``torchrun --nproc-per-node W ... model.tensor_parallel=N`` the W ranks form W/N tensor-parallel
groups of consecutive ranks ({0..N-1}, {N..2N-1}, ...); each group decodes one data-parallel shard
of the items (:class:`RankLayout`; ``dlmsearch.distributed.Ranks`` uses it). The groups are
``torch.distributed.new_group`` process groups (gloo on CPU, nccl on CUDA); nothing here is a
communication layer of its own: the one collective is ``all_reduce``.

**Native families (LLaDA, Dream, SDAR, LLaDA2): Megatron-style.** In every block q/k/v and the MLP's
gate/up are split column-wise (each rank keeps ``heads/N`` query heads, ``kv_heads/N`` key/value
heads, or the one its queries read where N is a multiple of them, and ``intermediate/N`` MLP columns); ``o_proj`` and ``down_proj`` row-wise, their partial sums
all-reduced over the group before each residual (the block's ``reduce``, which the per-token output
functions of :mod:`~dlmsearch.models.token_ops` apply; the identity in one process). So a block
costs two all-reduces of ``[tokens, hidden]``. The block's (and the model's) config becomes the
local one, so KV caches hold this rank's heads only. Embeddings, norms, q/k norms and the
vocabulary head stay replicated: every rank computes the same full logits (the all-reduce leaves
the same sum on every rank), so every rank takes the same decisions (draws are keyed by seed).

**LLaDA2's routed experts: expert parallelism.** The router (and its bias) stays replicated, so
every rank routes every token identically; rank ``r`` holds experts ``[r*E/N, (r+1)*E/N)`` whole and
computes only their weighted contributions (zeros for tokens routed elsewhere); the shared
experts are split like a dense MLP. Both are partial sums of the same ``[tokens, hidden]`` output,
so the block's one MLP all-reduce adds them together: no all-to-all, no extra collective, and an
expert's matrices are never split (splitting each expert's tiny ``moe_intermediate_size`` would
multiply the number of small matmuls by N for no memory gain over whole experts). The price is
load balance: a rank whose experts are popular in a step does more of the work.

**DiffusionGemma** (transformers' modules): :func:`parallelize_diffusion_gemma` (see there).

Loading reads only this rank's slices from safetensors (:func:`read_slice`, ``get_slice``), so a
model never exists whole in one process; :func:`shard_model` shards an in-memory model (tests).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import attrs
import torch

from dlmsearch.models import token_ops

if TYPE_CHECKING:
    from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

COLUMN = re.compile(r"blocks\.\d+\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)")
KEY_VALUE = re.compile(r"blocks\.\d+\.(k_proj|v_proj)\.(weight|bias)")
ROW = re.compile(r"blocks\.\d+\.(o_proj|down_proj)\.weight")
EXPERTS = re.compile(r"blocks\.\d+\.expert_(gate|up|down)")  # stacked [E, ...]: whole experts per rank
FUSED_QKV = re.compile(r"blocks\.\d+\.qkv\.weight")  # LLaDA2's query_key_value, before it is split
ONE_EXPERT = re.compile(r"blocks\.\d+\.experts\.(\d+)\.(gate|up|down)")  # LLaDA2's per-expert names


@attrs.frozen
class RankLayout:
    """Where rank ``rank`` of ``world`` sits with tensor-parallel groups of ``size`` consecutive ranks."""

    rank: int = 0
    world: int = 1
    size: int = 1

    def __attrs_post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"model.tensor_parallel must be a positive integer, got {self.size!r}")
        if self.world % self.size:
            raise ValueError(
                f"model.tensor_parallel={self.size} does not divide the {self.world} torchrun processes "
                "(WORLD_SIZE): each tensor-parallel group is that many consecutive ranks"
            )

    @property
    def tp_rank(self) -> int:
        return self.rank % self.size

    @property
    def dp_rank(self) -> int:
        """The data-parallel shard this rank's group decodes."""
        return self.rank // self.size

    @property
    def dp_world(self) -> int:
        return self.world // self.size

    def group_ranks(self, group: int) -> list[int]:
        """The global ranks of tensor-parallel group ``group``."""
        return list(range(group * self.size, (group + 1) * self.size))


def rank_layout_from_environment(size: int) -> RankLayout:
    """The rank layout torchrun's environment (``WORLD_SIZE``, ``RANK``) gives for groups of ``size``."""
    world = os.environ.get("WORLD_SIZE")
    if size != 1 and world is None:
        raise ValueError(
            f"model.tensor_parallel={size} needs torchrun: run `torchrun --nproc-per-node {size} -m dlmsearch ...` "
            "(WORLD_SIZE is not set)"
        )
    return RankLayout(int(os.environ.get("RANK", "0")), int(world or 1), size)


class AllReduce:
    """A block's ``reduce`` under tensor parallelism: ``all_reduce`` (sum) over the group, in place;
    counts the calls and bytes it sends (what ``experiments/tp_logit_table.py`` reports)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.calls = 0
        self.bytes = 0

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        partial = partial.contiguous()
        self.calls += 1
        self.bytes += partial.numel() * partial.element_size()
        dist.all_reduce(partial, group=self.group)
        return partial


@attrs.frozen(eq=False)
class TensorParallel:
    """This process's tensor-parallel group: its ``rank`` in it, its ``size``, the process group
    and the one :class:`AllReduce` every block of the model shares."""

    rank: int
    size: int
    group: Any = None
    reduce: Any = None

    def span(self, total: int, what: str) -> tuple[int, int]:
        """This rank's ``[start, stop)`` of ``total`` rows, which ``size`` must divide."""
        if total % self.size:
            raise ValueError(f"model.tensor_parallel={self.size} does not divide {what} ({total})")
        chunk = total // self.size
        return self.rank * chunk, (self.rank + 1) * chunk

    def kv_span(self, kv_heads: int, head_dim: int) -> tuple[int, int]:
        """This rank's key/value rows: ``1/size`` of the heads, or, where ``size`` is a multiple of
        them (LLaDA2-flash's 4 heads over 8 ranks, a multi-query model's one), the one whole head
        its query heads read, shared by ``size / kv_heads`` ranks (vLLM's replication)."""
        if kv_heads % self.size == 0:
            return self.span(kv_heads * head_dim, "the key/value heads")
        if self.size % kv_heads:
            raise ValueError(
                f"model.tensor_parallel={self.size} neither divides nor is a multiple of the key/value heads ({kv_heads})"
            )
        head = self.rank // (self.size // kv_heads)
        return head * head_dim, (head + 1) * head_dim


_JOINED: dict[int, TensorParallel] = {}


def join_process_group() -> None:
    """Join torchrun's process group once (nccl on CUDA, one GPU per local rank; gloo on CPU)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)


def join(size: int) -> TensorParallel | None:
    """This process's tensor-parallel group of ``size`` ranks under torchrun (None for 1): joins the
    process group if nobody has, and creates every group once (all ranks create all groups, in order)."""
    layout = rank_layout_from_environment(size)
    if size == 1:
        return None
    if size in _JOINED:
        return _JOINED[size]
    import torch.distributed as dist

    join_process_group()
    mine = None
    for group in range(layout.dp_world):
        created = dist.new_group(layout.group_ranks(group))
        if group == layout.dp_rank:
            mine = created
    _JOINED[size] = TensorParallel(layout.tp_rank, size, mine, AllReduce(mine))
    return _JOINED[size]


def check_shardable(config: TransformerConfig, size: int) -> None:
    """One ValueError naming what ``size`` does not divide (heads, kv heads, MLP widths, experts)."""
    widths = {
        "the attention heads (num_heads)": config.num_heads,
        "the MLP width (intermediate_size)": config.intermediate_size,
    }
    if config.moe is not None:
        widths["the routed experts (num_experts)"] = config.moe.num_experts
        widths["the shared experts' width (moe_intermediate_size * num_shared_experts)"] = (
            config.moe.intermediate_size * config.moe.shared_experts
        )
    for what, total in widths.items():
        if total % size:
            raise ValueError(f"model.tensor_parallel={size} does not divide {what}: {total}")
    kv = config.num_kv_heads
    if kv % size and size % kv:
        raise ValueError(
            f"model.tensor_parallel={size} neither divides nor is a multiple of the key/value heads (num_kv_heads): {kv}"
        )


def local_config(config: TransformerConfig, size: int) -> TransformerConfig:
    """The config one rank's blocks run with: ``1/size`` of the heads (at least one key/value head:
    :meth:`TensorParallel.kv_span`) and MLP width, ``head_dim`` kept (the MoE description stays
    global: the router scores every expert)."""
    check_shardable(config, size)
    return attrs.evolve(
        config,
        num_heads=config.num_heads // size,
        num_kv_heads=max(config.num_kv_heads // size, 1),  # one whole head per rank where size is a multiple
        intermediate_size=config.intermediate_size // size,
        head_dim=config.head_dim,
    )


def split_dim(name: str) -> int | None:
    """The dimension a native parameter is split along (0: column-wise or whole experts, 1: row-wise), None: replicated."""
    if COLUMN.fullmatch(name) or EXPERTS.fullmatch(name):
        return 0
    if ROW.fullmatch(name):
        return 1
    return None


def shard_model(module: BidirectionalTransformer, tp: TensorParallel | None) -> BidirectionalTransformer:
    """Keep this rank's slice of every split parameter (on meta or real tensors alike), make the
    configs local and give every block the group's all-reduce. ``tp=None``: unchanged."""
    if tp is None:
        return module
    config = local_config(module.config, tp.size)
    for name, param in list(module.named_parameters()):
        dim = split_dim(name)
        if dim is None:
            continue
        start, stop = _rows(name, param.shape[dim], module.config, tp) if dim == 0 else tp.span(param.shape[dim], name)
        owner, leaf = _owner(module, name)
        setattr(
            owner,
            leaf,
            torch.nn.Parameter(param.detach().narrow(dim, start, stop - start).clone(), param.requires_grad),
        )
    module.config = config
    for block in module.blocks:
        block.config = config
        block.reduce = tp.reduce
        if block.moe is not None:
            block.first_expert = tp.span(block.moe.num_experts, "num_experts")[0]
    module.tensor_parallel = tp
    return module


def _owner(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return module.get_submodule(path), leaf


def read_slice(name: str, view: Any, config: TransformerConfig, tp: TensorParallel | None) -> torch.Tensor | None:
    """This rank's part of the checkpoint tensor ``view`` (a safetensors ``get_slice``), whose native
    name is ``name`` (before LLaDA2's regrouping); None where this rank keeps none of it (another
    rank's expert). ``config``: the global one."""
    if tp is None:
        return view[:]
    expert = ONE_EXPERT.fullmatch(name)
    if expert:
        start, stop = tp.span(config.moe.num_experts, "num_experts")
        return view[:] if start <= int(expert[1]) < stop else None
    if FUSED_QKV.fullmatch(name):
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        parts = []
        kv_start, kv_stop = tp.kv_span(config.num_kv_heads, config.head_dim)
        for offset, (start, stop) in (
            (0, tp.span(q, "the query width")),
            (q, (kv_start, kv_stop)),
            (q + kv, (kv_start, kv_stop)),
        ):
            parts.append(view[offset + start : offset + stop])
        return torch.cat(parts)  # a new tensor of the shard's own size
    dim = split_dim(name)
    if dim is None:
        return view[:]
    total = view.get_shape()[dim]
    start, stop = _rows(name, total, config, tp) if dim == 0 else tp.span(total, name)
    return _compact(view[start:stop] if dim == 0 else view[:, start:stop])


def _rows(name: str, total: int, config: TransformerConfig, tp: TensorParallel) -> tuple[int, int]:
    """This rank's rows of a column-wise parameter: its key/value heads for k/v, else ``1/size`` of them."""
    if KEY_VALUE.fullmatch(name):
        return tp.kv_span(config.num_kv_heads, config.head_dim)
    return tp.span(total, name)


def _compact(part: torch.Tensor) -> torch.Tensor:
    """``part`` in storage of its own size: a safetensors slice can be a view of the whole tensor, and
    the whole tensor would then stay in memory for as long as the shard lives."""
    return part.clone() if part.untyped_storage().nbytes() > part.numel() * part.element_size() else part


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` was sharded by this module (its blocks all-reduce)."""
    return getattr(module, "tensor_parallel", None) is not None


# ---------------------------------------------------------------------------------------------
# DiffusionGemma (transformers' modules)
# ---------------------------------------------------------------------------------------------


def parallelize_diffusion_gemma(module: torch.nn.Module, tp: TensorParallel | None) -> list[str]:
    """Shard a ``DiffusionGemmaForBlockDiffusion``'s text layers (encoder and decoder) with
    ``torch.distributed.tensor.parallel.parallelize_module`` over a DeviceMesh of the group; returns
    what stayed replicated (one line each).

    transformers' own ``tp_plan="auto"`` (its ``base_model_tp_plan``) also turns the tied
    embedding / ``lm_head`` into a DTensor and the encoder's embedding lookup then fails (``aten.embedding``
    with mixed Tensor and DTensor), so the plan is applied here to the projections only:
    q/k/v and the dense MLP's gate/up ``ColwiseParallel``, o_proj and down_proj ``RowwiseParallel``
    (an all-reduce before the post-norms); a layer whose query or key/value heads ``size`` does not
    divide (Gemma's full-attention layers have few kv heads) keeps its attention replicated. The
    routed experts go by expert (:func:`_expert_parallel`, transformers' own ``ep_plan`` styles) where
    ``size`` divides them; the router, embeddings, norms, self-conditioning MLP and head stay replicated."""
    if tp is None:
        return []
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    text = module.config.get_text_config()
    mesh = DeviceMesh.from_group(tp.group, "cuda" if next(module.parameters()).is_cuda else "cpu")
    colwise, rowwise = ColwiseParallel(), RowwiseParallel()
    replicated = []
    if text.intermediate_size % tp.size:
        raise ValueError(
            f"model.tensor_parallel={tp.size} does not divide DiffusionGemma's MLP width (intermediate_size): {text.intermediate_size}"
        )
    encoder_layers = module.model.get_submodule("encoder.language_model").layers
    tied = [_shared_names(decoder, encoder) for decoder, encoder in zip(module.model.decoder.layers, encoder_layers)]
    for stack in ("encoder.language_model", "decoder"):
        layers = module.model.get_submodule(stack).layers
        for index, layer in enumerate(layers):
            if stack == "decoder":
                _tie_to_sharded(layer, encoder_layers[index], tied[index])
            plan = {"mlp.gate_proj": colwise, "mlp.up_proj": colwise, "mlp.down_proj": rowwise}
            attention = layer.self_attn
            heads = attention.q_proj.out_features // attention.head_dim
            kv_heads = attention.k_proj.out_features // attention.head_dim
            if heads % tp.size == 0 and kv_heads % tp.size == 0:
                plan |= {f"self_attn.{p}": colwise for p in ("q_proj", "k_proj")}
                plan |= {"self_attn.o_proj": rowwise}
                if attention.v_proj is not None:
                    plan["self_attn.v_proj"] = colwise
            elif stack == "decoder":
                replicated.append(
                    f"layer {index}'s attention ({heads} query / {kv_heads} key-value heads, not divisible by {tp.size})"
                )
            parallelize_module(layer, mesh, plan)
    experts = getattr(text, "num_experts", None) or 0
    if experts and experts % tp.size == 0:
        _expert_parallel(module, mesh, encoder_layers, tied)
    elif experts:
        replicated.append(f"the {experts} routed experts of every layer ({tp.size} does not divide them)")
    return replicated


def _expert_parallel(module: torch.nn.Module, mesh: Any, encoder_layers: Any, tied: list[list[str]]) -> None:
    """The routed experts by expert, through transformers' own expert parallelism (the styles of the
    model's ``base_model_ep_plan``: ``grouped_gemm`` shards the 3-D expert weights by expert,
    ``ep_dispatch_experts`` with ``AllReduceEP``): every rank of the group holds the same tokens, runs
    its ``E/N`` experts on them with the routes to other ranks' experts masked, and one all-reduce sums
    the partial outputs before the experts' post-norm. Applied module by module (the decoder's experts
    share the encoder's parameters, which a by-name plan would see once): the decoder's point at the
    encoder's shards."""
    import transformers.distributed.expert_parallel  # noqa: F401  registers the expert-parallel styles
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

    weights, dispatch = ALL_PARALLEL_STYLES["grouped_gemm"], ALL_PARALLEL_STYLES["ep_dispatch_experts"]

    def shard(experts: torch.nn.Module) -> None:
        for name in ("gate_up_proj", "down_proj"):
            weights.shard_param(experts, name, mesh)
        dispatch.install_forward(experts, ep_mesh=mesh, tp_mesh=mesh, ep_implementation="all_reduce")

    for layer in encoder_layers:
        shard(layer.experts)
    for layer, twin, names in zip(module.model.decoder.layers, encoder_layers, tied):
        _tie_to_sharded(layer, twin, [n for n in names if n.startswith("experts.")])
        shard(layer.experts)


def _shared_names(layer: torch.nn.Module, twin: torch.nn.Module) -> list[str]:
    """The parameters ``layer`` shares with ``twin`` (DiffusionGemma's decoder layers share their encoder's)."""
    return [name for name, parameter in layer.named_parameters() if twin.get_parameter(name) is parameter]


def _tie_to_sharded(layer: torch.nn.Module, twin: torch.nn.Module, names: list[str]) -> None:
    """Point ``layer``'s parameters ``names`` at ``twin``'s, now sharded: ``parallelize_module`` keeps a
    parameter that is already a DTensor of its placement as it is, so the two stacks hold one shard, not two."""
    for name in names:
        owner_name, _, leaf = name.rpartition(".")
        owner = layer.get_submodule(owner_name) if owner_name else layer
        owner.register_parameter(leaf, twin.get_parameter(name))


def local_reduce(module: torch.nn.Module) -> Any:
    """The all-reduce a sharded native model's blocks share (None: not sharded, or not native)."""
    blocks = getattr(module, "blocks", None)
    if not blocks or blocks[0].reduce is token_ops.identity:
        return None
    return blocks[0].reduce
