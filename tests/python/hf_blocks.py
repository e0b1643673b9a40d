"""relaymoe.hf against the Hugging Face blocks themselves (pytest, under
mpiexec through run.sh's pytest-hf, which reports 77 where torch or
transformers is absent): a sparse MoE block swapped for a RelayMoEBlock
gives the original's output, router logits, dx and parameter gradients
within 1e-5, with the load-balancing loss on the logits, for Qwen2-MoE
(top-k renormalised or not, its gated shared expert), Mixtral and, where
the installed transformers has it, Qwen3-MoE, on every dispatch; and
replace_moe_blocks swaps every block of a model. Each rank runs its own
tokens; the original's gradients are averaged over the ranks, as the
swapped block's are (reduction 'mean'). A swapped model deep-copies (an EMA
or evaluation copy with its own parameters and layers), refuses pickling
naming the state_dict route, which works; a float64 or bf16 model is refused
at the swap. Token counts that change per call and differ between the
ranks (16, 2, 2, 2, 7, then 21 tokens; none on one rank, on every dispatch)
match the originals with one relaymoe layer per block."""
import copy
import pickle

import numpy as np
import pytest
import torch

import relaymoe
import relaymoe.hf
from hf_common import tiny_qwen2_moe

# fp32 against fp32 summed in another order: the relative norm difference of
# each output and gradient.
TOL = 1e-5
H, E, K = 32, 8, 2


# comm and ctx: the fixtures of conftest.py.


def make_block(family, norm_topk=False):
    torch.manual_seed(3)
    if family == "qwen2_moe":
        from transformers import Qwen2MoeConfig
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
        return Qwen2MoeSparseMoeBlock(Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=16,
                                                     shared_expert_intermediate_size=24, num_experts=E,
                                                     num_experts_per_tok=K, norm_topk_prob=norm_topk))
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        return MixtralSparseMoeBlock(MixtralConfig(hidden_size=H, intermediate_size=16, num_local_experts=E,
                                                   num_experts_per_tok=K))
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    return Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=16, num_experts=E,
                                                 num_experts_per_tok=K, norm_topk_prob=norm_topk))


def families():
    known = relaymoe.hf.moe_block_families()
    cases = [("qwen2_moe", False), ("qwen2_moe", True), ("mixtral", True), ("qwen3_moe", True)]
    return [pytest.param(f, n, id=f"{f}{'-norm' if n else ''}",
                         marks=() if f in known else pytest.mark.skip(reason=f"{f} not in this transformers"))
            for f, n in cases]


def rel(a, b):
    return (a - b).norm().item() / max(b.norm().item(), 1e-30)


def run(block, x, dy, coef):
    from transformers.models.qwen2_moe.modeling_qwen2_moe import load_balancing_loss_func
    x = x.clone().requires_grad_(True)
    y, logits = block(x)
    loss = (y * dy).sum() + coef * load_balancing_loss_func((logits,), E, K)
    loss.backward()
    return y.detach(), logits.detach(), x.grad


@pytest.mark.parametrize("family,norm_topk", families())
@pytest.mark.parametrize("dispatch", ["ring", "token", "a2a", "a2a-megatron", "a2a-deepep"])
def test_swapped_block_matches_original(ctx, comm, family, norm_topk, dispatch):
    block = make_block(family, norm_topk)
    original = copy.deepcopy(block)
    swapped = relaymoe.hf.RelayMoEBlock.from_hf(block, ctx, dispatch=dispatch)
    assert swapped.norm_topk_prob == norm_topk
    assert (swapped.shared_expert_gate is not None) == (family == "qwen2_moe")
    g = torch.Generator().manual_seed(10 + comm.Get_rank())
    x = torch.rand(3, 10, H, generator=g) * 2 - 1
    dy = torch.rand(3, 10, H, generator=g) * 2 - 1
    want = run(original, x, dy, 0.5)
    got = run(swapped, x, dy, 0.5)
    errors = {name: rel(a, b) for name, a, b in zip(("y", "router_logits", "dx"), got, want)}
    # The original's gradients averaged over the ranks, every parameter in
    # the same order on every rank (a rank's swapped block holds only its
    # experts).
    mean = {}
    for name, p in original.named_parameters():
        total = np.empty_like(p.grad.numpy())
        comm.Allreduce(np.ascontiguousarray(p.grad.numpy()), total)
        mean[name] = torch.from_numpy(total / comm.Get_size())
    for name, p in swapped.named_parameters():
        errors["d " + name] = rel(p.grad, mean[name])
    # The swapped block holds the original's parameters under their names:
    # the replicated ones and this rank's experts, no other.
    owned = tuple(f"experts.{e}." for e in swapped.owned_experts)
    expect = {n for n in mean if not n.startswith("experts.") or n.startswith(owned)}
    assert set(dict(swapped.named_parameters())) == expect
    assert max(errors.values()) <= TOL, {k: v for k, v in errors.items() if v > TOL}
    swapped.close()


def tiny_model(seed):
    """A 2-layer Qwen2-MoE model, the same on every rank for one seed."""
    from transformers import Qwen2MoeConfig, Qwen2MoeModel
    torch.manual_seed(seed)
    return Qwen2MoeModel(Qwen2MoeConfig(vocab_size=50, hidden_size=H, intermediate_size=40, moe_intermediate_size=16,
                                        shared_expert_intermediate_size=24, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_experts=E,
                                        num_experts_per_tok=K, output_router_logits=True,
                                        attn_implementation="eager"))


def close_all(*models):
    for model in models:
        for m in model.modules():
            if isinstance(m, relaymoe.hf.RelayMoEBlock):
                m.close()


def test_replace_moe_blocks_in_a_model(ctx, comm):
    original = tiny_model(5)
    model = copy.deepcopy(original)
    blocks = relaymoe.hf.replace_moe_blocks(model, ctx)
    assert len(blocks) == 2 and all(isinstance(m.mlp, relaymoe.hf.RelayMoEBlock) for m in model.layers)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(comm.Get_rank()))
    a, b = original(input_ids=ids), model(input_ids=ids)
    assert rel(b.last_hidden_state, a.last_hidden_state) <= TOL
    assert all(rel(y, x) <= TOL for x, y in zip(a.router_logits, b.router_logits))
    with pytest.raises(ValueError, match="no sparse MoE block"):
        relaymoe.hf.replace_moe_blocks(torch.nn.Linear(2, 2), ctx)
    for blk in blocks:
        blk.close()


def test_deepcopy_of_a_swapped_model(ctx, comm):
    model = tiny_model(5)
    blocks = relaymoe.hf.replace_moe_blocks(model, ctx)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(comm.Get_rank()))
    model(input_ids=ids)  # the original's layers exist before the copy
    ema = copy.deepcopy(model)
    copies = [m.mlp for m in ema.layers]
    for b, c in zip(blocks, copies):
        # the same context; the original's layer stays its own
        assert isinstance(c, relaymoe.hf.RelayMoEBlock) and c._ctx is ctx and b.layer is not None
        assert c.layer is None
        assert c.owned_experts == b.owned_experts
    params = dict(model.named_parameters())
    for name, p in ema.named_parameters():
        assert p.data_ptr() != params[name].data_ptr() and torch.equal(p, params[name]), name
    # The copy's forward (a teacher's, under no_grad) between the original's
    # forward and backward: each block runs its own layer, so the
    # original's backward still has its forward's state.
    out = model(input_ids=ids)
    with torch.no_grad():
        teacher = ema(input_ids=ids)
    assert rel(teacher.last_hidden_state, out.last_hidden_state.detach()) <= TOL
    out.last_hidden_state.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert all(p.grad is None for p in ema.parameters())
    assert all(c.layer is not None and c.layer is not b.layer for b, c in zip(blocks, copies))
    # A step of the original leaves the copy's parameters as they were.
    before = {n: p.detach().clone() for n, p in ema.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(torch.equal(p, before[n]) for n, p in ema.named_parameters())
    # The copy trains too: its own gradients through its own layers.
    ema(input_ids=ids).last_hidden_state.square().mean().backward()
    assert all(c.gate.weight.grad is not None for c in copies)
    close_all(model, ema)


def test_pickling_names_the_state_dict_route(ctx, comm):
    model = tiny_model(5)
    relaymoe.hf.replace_moe_blocks(model, ctx)
    with pytest.raises(TypeError, match="state_dict"):
        pickle.dumps(model)
    with relaymoe.Layer(ctx, hidden=H, ffn=16, experts=E, topk=K, tokens=8) as layer:
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.deepcopy(layer)
    # The route it names: the state dict (this rank's experts and the
    # replicated rest) into a model swapped afresh on the same ranks.
    fresh = tiny_model(6)
    relaymoe.hf.replace_moe_blocks(fresh, ctx)
    fresh.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(comm.Get_rank()))
    with torch.no_grad():
        assert rel(fresh(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state) <= TOL
    close_all(model, fresh)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bf16"])
def test_swap_refuses_other_dtypes(ctx, dtype):
    model = tiny_model(5).to(dtype)
    with pytest.raises(TypeError, match=f"is {dtype}; relaymoe.hf runs CPU torch.float32 models only"):
        relaymoe.hf.replace_moe_blocks(model, ctx)
    # refused before any block was swapped
    assert not any(isinstance(m, relaymoe.hf.RelayMoEBlock) for m in model.modules())
    with pytest.raises(TypeError, match=f"parameter gate.weight is {dtype}"):
        relaymoe.hf.RelayMoEBlock.from_hf(make_block("mixtral").to(dtype), ctx)


def test_one_layer_per_block_for_any_token_count(ctx, comm):
    # A model called with batches of 16, 2, 2, 2, 7 and then 21 tokens (the
    # lengths turned by one per rank: counts differ between the ranks, and
    # the last call is above the capacity on some rank), each call against
    # the unswapped model; one relaymoe layer per block serves them all.
    from transformers import Qwen2MoeForCausalLM
    rank, size = comm.Get_rank(), comm.Get_size()
    lengths = [16, 2, 2, 2, 7, 21]
    mine = lengths[rank % len(lengths):] + lengths[:rank % len(lengths)]
    torch.manual_seed(8)
    original = Qwen2MoeForCausalLM(tiny_qwen2_moe(output_router_logits=True)).eval()
    model = copy.deepcopy(original)
    before = set(ctx._layers)
    blocks = relaymoe.hf.replace_moe_blocks(model, ctx)
    g = torch.Generator().manual_seed(30 + rank)
    for call, n in enumerate(mine):
        ids = torch.randint(0, 64, (1, n), generator=g)
        with torch.no_grad():
            a, b = original(input_ids=ids), model(input_ids=ids)
        errors = [rel(b.logits, a.logits)] + [rel(y, x) for x, y in zip(a.router_logits, b.router_logits)]
        assert max(errors) <= TOL, (call, n, errors)
    made = set(ctx._layers) - before
    assert len(made) == len(blocks) == 2 and made == {blk.layer for blk in blocks}
    first = max(lengths[r % len(lengths)] for r in range(size))
    for blk in blocks:
        # Made at the first call for its largest count over the ranks; every
        # call went through it.
        assert blk.layer.config["tokens"] == first and blk.layer.forwards == len(lengths)
        assert blk.layer.forward_tokens == mine[-1]
    close_all(model)
    assert all(blk.layer is None for blk in blocks)


def zero_sum_loss(y, logits, dy, c):
    """A loss on the output and, through a softmax as the load-balancing
    loss's is, on the router logits: defined for no tokens too (the
    load-balancing loss averages over the tokens)."""
    return (y * dy).sum() + (torch.softmax(logits, dim=-1) * c).sum()


@pytest.mark.parametrize("dispatch", ["ring", "token", "a2a", "a2a-megatron", "a2a-deepep"])
def test_block_with_no_tokens_on_a_rank(ctx, comm, dispatch):
    # Rank 0 brings no tokens, then the most (above the capacity the first
    # call set); each call against the original block, the parameters'
    # gradients against the original's averaged over the ranks.
    rank, size = comm.Get_rank(), comm.Get_size()
    block = make_block("qwen2_moe")
    original = copy.deepcopy(block)
    swapped = relaymoe.hf.RelayMoEBlock.from_hf(block, ctx, dispatch=dispatch)
    g = torch.Generator().manual_seed(50 + rank)
    for call, n in enumerate([0 if rank == 0 else 5 + rank, 11 if rank == 0 else 3]):
        x = torch.rand(1, n, H, generator=g) * 2 - 1
        dy = torch.rand(1, n, H, generator=g) * 2 - 1
        c = torch.rand(n, E, generator=g)
        got, want = {}, {}
        for name, blk, out in (("swapped", swapped, got), ("original", original, want)):
            blk.zero_grad(set_to_none=True)
            xg = x.clone().requires_grad_(True)
            y, logits = blk(xg)
            zero_sum_loss(y, logits, dy, c).backward()
            out.update(y=y.detach(), logits=logits.detach(), dx=xg.grad)
            for pname, p in blk.named_parameters():
                # A parameter no token reached has no gradient: zero.
                out["d " + pname] = p.grad if p.grad is not None else torch.zeros_like(p)
        for pname, p in original.named_parameters():
            total = np.empty(p.shape, np.float32)
            comm.Allreduce(np.ascontiguousarray(want["d " + pname].numpy()), total)
            want["d " + pname] = torch.from_numpy(total / size)
        assert got["y"].shape == (1, n, H) and got["dx"].shape == (1, n, H)
        errors = {k: rel(v, want[k]) for k, v in got.items() if want[k].norm() > 0}
        assert max(errors.values(), default=0.0) <= TOL, (call, n, {k: v for k, v in errors.items() if v > TOL})
        assert all(v.norm() == 0 for k, v in got.items() if want[k].norm() == 0), call
    assert swapped.layer.forwards == 2
    swapped.close()
