"""A tiny random-init Qwen2-MoE model (2 layers, Hugging Face transformers)
trained for a few AdamW steps with its MoE blocks swapped for relaymoe's
(relaymoe.hf.replace_moe_blocks), the load-balancing loss on, under mpirun,
on batches whose size and sequence length change from step to step and
differ between the ranks (as a loader of variable-length batches gives):
each step's loss, and the parameters after the last step, must match those
of the unswapped model on one process, which runs every rank's batch in
turn and steps on the mean of their losses (what DDP computes), within fp32
tolerance. Every block runs one relaymoe layer throughout.
Exit 77 where torch or transformers is absent (a failure under
RMOE_EMBED_REQUIRE=1)."""
import copy
import sys

from hf_common import require_hf, tiny_qwen2_moe

require_hf("hf_train_lengths")
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402
from transformers import Qwen2MoeForCausalLM  # noqa: E402

import relaymoe  # noqa: E402
import relaymoe.hf  # noqa: E402

STEPS = 5
LENGTHS = [12, 5, 16, 3, 9, 14, 7]
# fp32 against fp32 in another order of operations: relative difference of
# each step's loss (the relaymoe layer and PyTorch sum in different orders),
# and of each parameter after the steps.
TOL, TOL_PARAMS = 1e-5, 1e-5

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
config = tiny_qwen2_moe(output_router_logits=True, router_aux_loss_coef=0.05, max_position_embeddings=max(LENGTHS))
torch.manual_seed(0)
reference = Qwen2MoeForCausalLM(config)
model = copy.deepcopy(reference)
ctx = relaymoe.Context(comm)
blocks = relaymoe.hf.replace_moe_blocks(model, ctx)


def batch(step, r):
    """Rank r's batch at a step: 1 or 2 sequences of a length that changes
    with the step and the rank, the same on every rank for (step, r)."""
    shape = (1 + (step + r) % 2, LENGTHS[(step + 3 * r) % len(LENGTHS)])
    return torch.randint(0, config.vocab_size, shape, generator=torch.Generator().manual_seed(100 * step + r))


opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
worst, layers = 0.0, None
for step in range(STEPS):
    # the unswapped model, one process: every rank's batch in turn
    opt_ref.zero_grad()
    ref_loss = 0.0
    for r in range(size):
        ids = batch(step, r)
        out = reference(input_ids=ids, labels=ids)
        (out.loss / size).backward()
        ref_loss += out.loss.item() / size
    # A parameter no rank's tokens reached gets zeros, as in the swapped
    # blocks (AdamW skips a parameter without a gradient, weight decay too).
    for p in reference.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt_ref.step()
    # relaymoe: this rank's batch
    opt.zero_grad()
    ids = batch(step, rank)
    out = model(input_ids=ids, labels=ids)
    assert out.aux_loss is not None and out.aux_loss.item() > 0
    out.loss.backward()
    relaymoe.hf.allreduce_gradients(model, ctx)
    opt.step()
    loss = comm.allreduce(out.loss.item()) / size
    err = abs(loss - ref_loss) / abs(ref_loss)
    worst = max(worst, err)
    counts = comm.allgather(ids.numel())
    if layers is None:
        layers = [b.layer for b in blocks]
    assert [b.layer for b in blocks] == layers and all(layer.forwards == step + 1 for layer in layers)
    if rank == 0:
        print(f"step {step}: tokens per rank {counts}: loss {loss:.6f} (unswapped, one process: {ref_loss:.6f}), "
              f"relative difference {err:.1e}")

# The parameters this rank holds (the replicated ones and its experts)
# against the reference's. Not the attention's key bias: it shifts a
# query's scores over every key alike, which the softmax ignores, so its
# gradient is rounding noise, and AdamW, dividing by the gradient's running
# norm, steps on that noise as on a gradient.
params = dict(reference.named_parameters())
drift = {name: ((p - params[name]).norm() / params[name].norm()).item() for name, p in model.named_parameters()
         if not name.endswith("k_proj.bias")}
name, most = max(drift.items(), key=lambda kv: kv[1])
most = comm.allreduce(most, op=MPI.MAX)
ctx.close()
ok = worst <= TOL and most <= TOL_PARAMS
if rank == 0:
    print(f"hf_train_lengths on {size} rank(s): largest relative difference of the losses {worst:.2e} (tolerance "
          f"{TOL:.0e}), of the parameters {most:.2e} (tolerance {TOL_PARAMS:.0e}): {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
