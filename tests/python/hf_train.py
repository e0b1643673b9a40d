"""A tiny random-init Qwen2-MoE model (2 layers, Hugging Face transformers)
trained for 20 steps with its MoE blocks swapped for relaymoe's
(relaymoe.hf.replace_moe_blocks), the load-balancing loss on, under mpirun:
each rank trains on its share of the batch, as data parallelism does, and
its losses must match those of the unswapped model on one process, which
runs every rank's share in turn and steps on the mean of their losses (what
DDP computes), within fp32 tolerance.
Exit 77 where torch or transformers is absent (a failure under
RMOE_EMBED_REQUIRE=1)."""
import copy
import sys

from hf_common import require_hf, tiny_qwen2_moe

require_hf("hf_train")
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402
from transformers import Qwen2MoeForCausalLM  # noqa: E402

import relaymoe  # noqa: E402
import relaymoe.hf  # noqa: E402

STEPS, BATCH, SEQ = 20, 4, 16
# fp32 against fp32 in another order of operations: relative difference of
# each step's loss (the relaymoe layer and PyTorch sum in different orders).
TOL = 1e-5

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert BATCH % size == 0, f"the batch of {BATCH} sequences is split over the ranks"
config = tiny_qwen2_moe(output_router_logits=True, router_aux_loss_coef=0.05, max_position_embeddings=SEQ)
torch.manual_seed(0)
reference = Qwen2MoeForCausalLM(config)
model = copy.deepcopy(reference)
ctx = relaymoe.Context(comm)
blocks = relaymoe.hf.replace_moe_blocks(model, ctx)
assert len(blocks) == 2 and all(b.shared_expert_gate is not None for b in blocks)

# One batch, every step: the model learns it, so the loss falls.
data = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
share = BATCH // size
opt_ref = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.9)
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
worst, losses = 0.0, []
for step in range(STEPS):
    # the unswapped model, one process: every rank's share in turn
    opt_ref.zero_grad()
    ref_loss = 0.0
    for r in range(size):
        ids = data[r * share:(r + 1) * share]
        out = reference(input_ids=ids, labels=ids)
        (out.loss / size).backward()
        ref_loss += out.loss.item() / size
    opt_ref.step()
    # relaymoe: this rank's share
    opt.zero_grad()
    ids = data[rank * share:(rank + 1) * share]
    out = model(input_ids=ids, labels=ids)
    assert out.aux_loss is not None and out.aux_loss.item() > 0
    out.loss.backward()
    relaymoe.hf.allreduce_gradients(model, ctx)
    opt.step()
    loss = comm.allreduce(out.loss.item()) / size
    err = abs(loss - ref_loss) / abs(ref_loss)
    worst = max(worst, err)
    losses.append(loss)
    if rank == 0:
        print(f"step {step:2d}: loss {loss:.6f} (unswapped, one process: {ref_loss:.6f}), relative difference "
              f"{err:.1e}, aux {out.aux_loss.item():.4f}")
ctx.close()
ok = worst <= TOL and losses[-1] < losses[0]
if rank == 0:
    print(f"hf_train on {size} rank(s): largest relative difference {worst:.2e} (tolerance {TOL:.0e}), loss "
          f"{losses[0]:.4f} -> {losses[-1]:.4f}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
