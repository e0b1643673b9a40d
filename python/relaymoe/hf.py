"""Hugging Face MoE blocks on the ring: replace_moe_blocks(model, ctx) swaps
every sparse MoE block of a transformers model (Qwen2-MoE, Mixtral, and
Qwen3-MoE where the installed transformers has it) for a RelayMoEBlock that
runs forward and backward through a relaymoe layer.

    from mpi4py import MPI
    import relaymoe, relaymoe.hf
    ctx = relaymoe.Context(MPI.COMM_WORLD)
    relaymoe.hf.replace_moe_blocks(model, ctx)      # this rank keeps its experts
    out = model(input_ids, labels=labels)           # router logits as the block returns them
    out.loss.backward()
    relaymoe.hf.allreduce_gradients(model, ctx)     # the rest of the model, as DDP would
    optimizer.step()

A RelayMoEBlock keeps the block's own modules as they are (its gate, the
experts this rank owns under their global numbers, the shared expert and its
gate), so the parameters stay nn.Parameters with the names of the original
block, and an optimizer steps them. It routes as the block does (its top-k,
norm_topk_prob, Qwen2-MoE's gated shared expert) and returns what the block
returns: the output and the router logits, whose gradient (the
load-balancing loss's) reaches the router through rmoe_layer_backward_ex as
a gradient on the probabilities.

Gradients, as DDP gives them: each rank's loss is its own tokens' mean, and
the step follows the mean of the ranks' losses. The block's replicated
parameters (gate, shared expert and its gate) get their gradient averaged
over the ranks inside backward; the experts a rank owns get the gradient of
every rank's tokens, divided by the ranks (reduction="sum" leaves both
summed: the gradient of the sum of the ranks' losses). Every other parameter
is the application's: allreduce_gradients averages them (DDP would too, but
it must then ignore the experts, which differ from rank to rank).

A block's layers wait at most WAIT_TIMEOUT seconds (ten minutes) for the
other ranks at each collective call, unless wait_timeout= or
RMOE_WAIT_TIMEOUT says otherwise (0 waits forever): a rank that stops
calling the blocks while another still does (generation that ends early,
an exception on one rank) gives the others an RMOE_EPEER naming it rather
than a hang. generate(model, ctx, ...) runs transformers' generate so that
ranks whose sequences end at different steps (EOS, different
max_new_tokens) all finish: a rank that is done keeps serving its experts
until every rank is (transformers' synced_gpus, as for ZeRO-3).

Tensors are CPU float32: a block whose parameters are of another dtype or
on another device is refused at the swap (Layer's dtype='bf16' stores the
layer's weights and activations in bf16 while the model stays float32).
Every rank calls the blocks in the same order (the layer is collective),
each with its own number of tokens, 0 included, which may change from call
to call (batches of different lengths, a short last batch, generation's
prompt then one token per step). A block runs one relaymoe layer, made at
its first forward with that call's largest count over the ranks as its
capacity (or the option tokens=); a later call that brings more grows it.

copy.deepcopy of a swapped model (an EMA or an evaluation copy) gives blocks
that share the context, hold copies of the parameters and make their own
layer on their first forward; pickling one (torch.save of the whole model)
raises: save its state_dict and load that into a model swapped afresh.
"""
import copy
import datetime
import os
import socket

import numpy as np
import torch

from ._core import Context, Layer, config_default

__all__ = ["RelayMoEBlock", "replace_moe_blocks", "allreduce_gradients", "generate", "moe_block_families",
           "WAIT_TIMEOUT"]

# Seconds a block's layer waits for the other ranks at a collective call when
# neither the block's options nor RMOE_WAIT_TIMEOUT say: well above any pass
# of a model this module runs, and the default of NCCL's own watchdog, so a
# rank left waiting by one that stopped calling the blocks ends with an error
# naming that rank instead of hanging.
WAIT_TIMEOUT = 600.0


# ---- the blocks this module knows -------------------------------------------------


def _is_silu(act):
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


class _Family:
    """How one transformers block names its parts: per expert the SwiGLU's
    gate, up and down nn.Linear (weights [F, H], [F, H], [H, F]), the
    activation, whether the top-k is renormalised, the shared expert."""

    def __init__(self, name, cls, gate, up, down, act, norm_topk, shared=None, shared_gate=None):
        self.name, self.cls = name, cls
        self.gate, self.up, self.down, self.act = gate, up, down, act
        self.norm_topk, self.shared, self.shared_gate = norm_topk, shared, shared_gate


def moe_block_families():
    """The sparse MoE block classes of the installed transformers that
    replace_moe_blocks finds, by family name."""
    fams = []
    try:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
        fams.append(_Family("qwen2_moe", Qwen2MoeSparseMoeBlock, "gate_proj", "up_proj", "down_proj", "act_fn",
                            lambda b: bool(b.norm_topk_prob), "shared_expert", "shared_expert_gate"))
    except ImportError:
        pass
    try:
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        # Mixtral always renormalises its top-k (w1 gate, w3 up, w2 down).
        fams.append(_Family("mixtral", MixtralSparseMoeBlock, "w1", "w3", "w2", "act_fn", lambda b: True))
    except ImportError:
        pass
    try:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        fams.append(_Family("qwen3_moe", Qwen3MoeSparseMoeBlock, "gate_proj", "up_proj", "down_proj", "act_fn",
                            lambda b: bool(b.norm_topk_prob)))
    except ImportError:
        pass
    return {f.name: f for f in fams}


def _family_of(block):
    for f in moe_block_families().values():
        if type(block) is f.cls:
            return f
    return None


# ---- gradient reduction ----------------------------------------------------------


def _comm(ctx):
    if ctx.size == 1:
        return None
    if ctx.comm is not None:
        return ctx.comm
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError("relaymoe.hf sums replicated gradients over the ranks with mpi4py, which is not "
                           "installed (python3-mpi4py); create the context from an mpi4py communicator") from None
    return MPI.COMM_WORLD


def _allreduce(comm, arrays):
    """Sums each float32 array over the ranks, in place, in one call."""
    if comm is None or not arrays:
        return
    flat = np.concatenate([a.ravel() for a in arrays]).astype(np.float32)
    total = np.empty_like(flat)
    from mpi4py import MPI
    comm.Allreduce(flat, total, op=MPI.SUM)
    at = 0
    for a in arrays:
        a.ravel()[:] = total[at:at + a.size]
        at += a.size


# ---- the block -------------------------------------------------------------------


class _BlockFunction(torch.autograd.Function):
    """(y, router_logits) = _BlockFunction.apply(block, x, *block._params())"""

    @staticmethod
    def forward(ctx, block, x, *params):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        layer = block._layer_for(x.shape[0])
        block._load(layer, params)
        xn = x.detach().to(torch.float32).contiguous().numpy()
        y = layer.forward(xn)
        w_router = params[0].detach()
        logits = x.detach() @ w_router.t()
        ctx.block, ctx.layer, ctx.forward_number = block, layer, layer.forwards
        ctx.save_for_backward(*params)
        return torch.from_numpy(y), logits

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dlogits):
        ctx.saved_tensors  # noqa: B018 (torch's in-place modification check)
        layer, block = ctx.layer, ctx.block
        if layer.forwards != ctx.forward_number:
            raise RuntimeError("relaymoe.hf: backward of an earlier forward of this block; the layer keeps "
                               "only its last forward (run backward before the block's next forward)")
        if dy is None:
            dy = torch.zeros(layer.forward_tokens, layer.hidden)
        dprobs = None
        if dlogits is not None:
            # A gradient on the logits that came through a softmax (the
            # load-balancing loss's) as a gradient on the probabilities:
            # dlogits = p (dp - <p, dp>) holds for dp = dlogits / p when
            # dlogits sums to zero over the experts, as a softmax's does.
            p = torch.from_numpy(layer.routing()[2])
            dl = dlogits.detach().to(torch.float32)
            dprobs = torch.where(p > 0, dl / p.clamp_min(torch.finfo(torch.float32).tiny),
                                 torch.zeros_like(dl)).contiguous().numpy()
        dx = layer.backward(dy.detach().to(torch.float32).contiguous().numpy(), dprobs=dprobs)
        grads = block._grads(layer)
        return (None, torch.from_numpy(dx)) + tuple(grads)


class RelayMoEBlock(torch.nn.Module):
    """A transformers sparse MoE block run by relaymoe (see the module's
    documentation). from_hf(block, ctx) builds one from a block."""

    def __init__(self, block, ctx, family, *, dispatch="ring", reduction="mean", **options):
        super().__init__()
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: a relaymoe.Context is expected, not {type(ctx).__name__}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction {reduction!r}: expected 'mean' (as DDP) or 'sum'")
        E = len(block.experts)
        if E % ctx.size:
            raise ValueError(f"the block has {E} experts, not divisible by the {ctx.size} ranks")
        _check_tensors(block)
        first = ctx.rank * (E // ctx.size)
        self.owned_experts = range(first, first + E // ctx.size)
        self.family, self.num_experts, self.top_k = family.name, E, int(block.top_k)
        self.norm_topk_prob = family.norm_topk(block)
        self.jitter_noise = float(getattr(block, "jitter_noise", 0.0) or 0.0)
        self._names = (family.gate, family.up, family.down)
        self.gate = block.gate
        # The owned experts under their global numbers: the state dict names
        # them as the original block does.
        self.experts = torch.nn.ModuleDict({str(e): block.experts[e] for e in self.owned_experts})
        for e, mlp in self.experts.items():
            if not _is_silu(getattr(mlp, family.act)):
                raise ValueError(f"expert {e}: activation {type(getattr(mlp, family.act)).__name__}; relaymoe's "
                                 f"experts are SwiGLU (hidden_act 'silu')")
        self.shared_expert = getattr(block, family.shared) if family.shared else None
        self.shared_expert_gate = getattr(block, family.shared_gate) if family.shared_gate else None
        if self.shared_expert is not None and not _is_silu(self.shared_expert.act_fn):
            raise ValueError("the shared expert's activation is not SiLU")
        for lin in [self.gate] + ([self.shared_expert_gate] if self.shared_expert_gate is not None else []):
            if lin.bias is not None:
                raise ValueError("a router or shared-expert gate with a bias: relaymoe's have none")
        mlp0 = block.experts[0]
        self.hidden = self.gate.in_features
        self.ffn = getattr(mlp0, family.gate).out_features
        self.shared_ffn = self.shared_expert.gate_proj.out_features if self.shared_expert is not None else 0
        self._ctx, self._reduction = ctx, reduction
        self._options = dict(options, dispatch=dispatch)
        if self._options.get("wait_timeout") is None:
            self._options["wait_timeout"] = config_default("wait_timeout") or WAIT_TIMEOUT
        self._layer = None

    @property
    def layer(self):
        """The block's relaymoe.Layer, made at its first forward (None before)."""
        return self._layer

    def __deepcopy__(self, memo):
        """A copy for an EMA or an evaluation model: copies of the parameters
        (and of every other module and attribute), the same context, and no
        layer: the copy makes its own on its first forward, collectively, as
        the original did. Sharing the original's layer would tie the two
        together, as a layer keeps the state of its last forward for its
        backward: a forward of the copy between the original's forward and
        backward (a teacher's, in distillation) would make that backward
        fail."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        # _ctx comes back as itself (Context.__deepcopy__)
        for name, value in self.__dict__.items():
            new.__dict__[name] = None if name == "_layer" else copy.deepcopy(value, memo)
        return new

    def __reduce_ex__(self, protocol):
        raise TypeError("a RelayMoEBlock cannot be pickled or shallow-copied: it holds a relaymoe.Context (this "
                        "process's MPI and StarPU) and its layer. Save model.state_dict() instead and load it "
                        "into a model swapped afresh with relaymoe.hf.replace_moe_blocks (copy.deepcopy works "
                        "within the process)")

    @classmethod
    def from_hf(cls, block, ctx, **options):
        family = _family_of(block)
        if family is None:
            raise TypeError(f"{type(block).__name__} is not a sparse MoE block relaymoe.hf knows "
                            f"({', '.join(f.cls.__name__ for f in moe_block_families().values())})")
        return cls(block, ctx, family, **options)

    def extra_repr(self):
        return (f"{self.family}: experts {self.owned_experts.start}..{self.owned_experts.stop - 1} of "
                f"{self.num_experts} here, top-{self.top_k}, norm_topk_prob={self.norm_topk_prob}, "
                f"shared_ffn={self.shared_ffn}{' gated' if self.shared_expert_gate is not None else ''}")

    # -- relaymoe side --------------------------------------------------------------

    def _layer_for(self, tokens):
        """The block's one layer, for a call of tokens rows on this rank (the
        forward sets the count). Made at the first call, collectively as
        every rank's first call of the block is: the configuration must be
        the same on every rank, so its capacity is the option tokens= or the
        largest of the ranks' counts in that call (at least 1)."""
        if self._layer is None:
            options = dict(self._options)
            capacity = options.pop("tokens", None)
            if capacity is None:
                capacity = tokens
                comm = _comm(self._ctx)
                if comm is not None:
                    from mpi4py import MPI
                    capacity = comm.allreduce(tokens, op=MPI.MAX)
            self._layer = Layer(self._ctx, hidden=self.hidden, ffn=self.ffn, experts=self.num_experts,
                                topk=self.top_k, tokens=max(capacity, 1), norm_topk=self.norm_topk_prob,
                                shared_ffn=self.shared_ffn, shared_gated=self.shared_expert_gate is not None,
                                **options)
        return self._layer

    def _params(self):
        """The autograd inputs: router, per owned expert gate, up, down, then
        the shared expert's gate, up, down and its sigmoid gate."""
        p = [self.gate.weight]
        g, u, d = self._names
        for mlp in self.experts.values():
            p += [getattr(mlp, g).weight, getattr(mlp, u).weight, getattr(mlp, d).weight]
        if self.shared_expert is not None:
            s = self.shared_expert
            p += [s.gate_proj.weight, s.up_proj.weight, s.down_proj.weight]
        if self.shared_expert_gate is not None:
            p.append(self.shared_expert_gate.weight)
        return p

    @staticmethod
    def _np(t):
        """An nn.Linear weight [out, in] as relaymoe's [in, out] float32."""
        return np.ascontiguousarray(t.detach().to(torch.float32).numpy().T)

    def _load(self, layer, params):
        layer.set_router(self._np(params[0]))
        at = 1
        for e in self.owned_experts:
            g, u, d = params[at:at + 3]
            layer.set_expert(e, self._np(g), self._np(u), self._np(d))
            at += 3
        if self.shared_expert is not None:
            g, u, d = params[at:at + 3]
            layer.set_shared(self._np(g), self._np(u), self._np(d))
            at += 3
        if self.shared_expert_gate is not None:
            layer.set_shared_expert_gate(np.ascontiguousarray(params[at].detach().to(torch.float32).numpy()[0]))

    def _grads(self, layer):
        """The parameters' gradients in their own layouts, reduced as the
        block's reduction says."""
        replicated = [layer.grad_router()]
        owned = []
        for e in self.owned_experts:
            owned += list(layer.grad_expert(e))
        if self.shared_expert is not None:
            replicated += list(layer.grad_shared())
        if self.shared_expert_gate is not None:
            replicated.append(layer.grad_shared_expert_gate()[None, :])
        _allreduce(_comm(self._ctx), replicated)
        if self._reduction == "mean" and self._ctx.size > 1:
            for a in replicated + owned:
                a /= self._ctx.size
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a.T))  # noqa: E731
        out = [t(replicated[0])] + [t(a) for a in owned]
        if self.shared_expert is not None:
            out += [t(a) for a in replicated[1:4]]
        if self.shared_expert_gate is not None:
            out.append(torch.from_numpy(replicated[-1]))
        return out

    # -- torch side --------------------------------------------------------------------

    def forward(self, hidden_states):
        shape = hidden_states.shape
        if hidden_states.dtype != torch.float32 or hidden_states.device.type != "cpu":
            raise TypeError(f"hidden_states: {hidden_states.dtype} on {hidden_states.device}; relaymoe.hf "
                            f"takes CPU float32")
        if self.training and self.jitter_noise > 0:
            # Mixtral's router jitter, as the block applies it
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
                1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
        x = hidden_states.reshape(-1, shape[-1])
        y, logits = _BlockFunction.apply(self, x, *self._params())
        return y.reshape(shape), logits

    def close(self):
        """Closes the block's layer; a later forward makes a new one."""
        if self._layer is not None:
            self._layer.close()
            self._layer = None


def _check_tensors(block):
    """Refuses, when the block is swapped rather than at its first forward,
    a block whose parameters relaymoe.hf cannot run: the library's interface
    takes CPU float32 arrays."""
    for name, p in block.named_parameters():
        if p.dtype != torch.float32:
            raise TypeError(f"{type(block).__name__}: parameter {name} is {p.dtype}; relaymoe.hf runs CPU "
                            f"torch.float32 models only: convert the model with model.float() before swapping "
                            f"(dtype='bf16' then stores the layers' weights and activations in bf16)")
        if p.device.type != "cpu":
            raise TypeError(f"{type(block).__name__}: parameter {name} is on {p.device}; relaymoe.hf runs CPU "
                            f"torch.float32 models only: move the model with model.cpu() before swapping")


# ---- whole models -----------------------------------------------------------------


def replace_moe_blocks(model, ctx, **options):
    """Swaps every sparse MoE block of model (a torch.nn.Module) for a
    RelayMoEBlock, in place; options go to each (dispatch='ring', 'token',
    'a2a', ...; reduction='mean' or 'sum'; any relaymoe.Layer keyword).
    Returns the new blocks. Collective only in that every rank must make the
    same swaps. Every block is checked before any is swapped: a refused one
    (a float64 or bf16 model, say) leaves the model as it was."""
    swaps = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if _family_of(child) is not None:
                swaps.append((module, child_name, RelayMoEBlock.from_hf(child, ctx, **options)))
    if not swaps:
        raise ValueError(f"no sparse MoE block relaymoe.hf knows in {type(model).__name__} "
                         f"(known: {', '.join(f.cls.__name__ for f in moe_block_families().values())})")
    for module, child_name, new in swaps:
        setattr(module, child_name, new)
    return [new for _, _, new in swaps]


def allreduce_gradients(model, ctx, reduction="mean"):
    """Averages (or sums) over the ranks the gradient of every parameter of
    model that no RelayMoEBlock handles (attention, norms, embeddings: the
    replicated rest of the model), as DDP would; the blocks' own are reduced
    in their backward already."""
    comm = _comm(ctx)
    if comm is None:
        return
    mine = set()
    for m in model.modules():
        if isinstance(m, RelayMoEBlock):
            mine.update(id(p) for p in m.parameters())
    params = [p for p in model.parameters() if id(p) not in mine and p.grad is not None]
    arrays = [p.grad.detach().to(torch.float32).contiguous().numpy().copy() for p in params]
    _allreduce(comm, arrays)
    for p, a in zip(params, arrays):
        if reduction == "mean":
            a /= ctx.size
        p.grad.copy_(torch.from_numpy(a))


# ---- generation --------------------------------------------------------------------


def generate(model, ctx, *args, **kwargs):
    """model.generate(*args, **kwargs) on every rank of ctx, for a model
    whose blocks were swapped: ranks whose sequences end at different steps
    (EOS on one rank first, a different max_new_tokens) all finish, each
    with the tokens it would have generated alone. A rank that is done keeps
    running the model, so its blocks serve its experts to the others, until
    every rank is: transformers' synced_gpus (as for DeepSpeed ZeRO-3),
    whose vote goes over torch.distributed; when no default process group is
    initialised, generate makes a gloo one of ctx's ranks (rank 0 holds the
    store: 127.0.0.1 when every rank is on its host, else MASTER_ADDR or rank
    0's host name). Ranks may pass different batch sizes and prompt lengths:
    each block call takes every rank's own count."""
    if ctx.size > 1:
        if kwargs.get("synced_gpus") is False:
            raise ValueError("relaymoe.hf.generate: synced_gpus=False on several ranks would leave the ranks "
                             "still generating waiting for the others' experts; leave it out")
        _process_group(ctx)
        kwargs["synced_gpus"] = True
    else:
        # Given, synced_gpus spares generate its probe for FSDP, whose import
        # fails with Debian 12's PyTorch 1.13 on Python 3.11.
        kwargs.setdefault("synced_gpus", False)
    return model.generate(*args, **kwargs)


def _process_group(ctx):
    """torch.distributed's default group as ctx's ranks: the one the
    application made (checked), or a gloo group made here."""
    import torch.distributed as dist
    if not dist.is_available():
        raise RuntimeError("relaymoe.hf.generate needs torch.distributed, which this PyTorch lacks")
    if dist.is_initialized():
        if dist.get_world_size() != ctx.size or dist.get_rank() != ctx.rank:
            raise RuntimeError(f"torch.distributed's default group has this process as rank {dist.get_rank()} "
                               f"of {dist.get_world_size()}, the relaymoe context as rank {ctx.rank} of "
                               f"{ctx.size}: generate needs the same ranks in both")
        return
    comm = _comm(ctx)
    hosts = comm.allgather(socket.gethostname())
    addr = "127.0.0.1" if len(set(hosts)) == 1 else os.environ.get("MASTER_ADDR") or hosts[0]
    timeout = datetime.timedelta(seconds=WAIT_TIMEOUT)
    store, port, why = None, 0, None
    if ctx.rank == 0:
        try:
            # Port 0: the store listens on a free port, which the others
            # learn below; so it must not wait for them here.
            store = dist.TCPStore(addr, 0, ctx.size, True, timeout, wait_for_workers=False)
            port = store.port
        except (RuntimeError, OSError) as e:
            why = f"rank 0 could not open torch.distributed's store on {addr}: {e}"
    port, why = comm.bcast((port, why), root=0)
    if why:
        raise RuntimeError(f"relaymoe.hf.generate: {why}")
    if store is None:
        store = dist.TCPStore(addr, port, ctx.size, False, timeout)
    dist.init_process_group("gloo", store=store, rank=ctx.rank, world_size=ctx.size, timeout=timeout)
