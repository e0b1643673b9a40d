"""Generation that ends unevenly across the ranks (relaymoe.hf.generate):
a tiny random-init Qwen2-MoE model with its MoE blocks swapped for
relaymoe's, each rank with its own prompts, greedy decoding. Every rank's
tokens must equal those the unswapped model generates for the same prompts
on that rank alone, when the ranks stop at different steps:
  1. a different max_new_tokens on each rank (4, 9, 14, ...);
  2. EOS: rank 0's end-of-sequence token is one its greedy output reaches
     at the third new token, the others' one they never reach;
  3. a different batch size and prompt length on each rank too: every
     block call brings each rank's own token count to one layer per block.
The ranks' output lengths are checked to differ, so the case did happen.
Also: the blocks' layers wait WAIT_TIMEOUT seconds by default (not forever),
an explicit wait_timeout is kept, and synced_gpus=False is refused.
Exit 77 where torch or transformers is absent (a failure under
RMOE_EMBED_REQUIRE=1)."""
import copy
import os
import sys

from hf_common import require_hf, tiny_qwen2_moe

require_hf("hf_generate")
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402
from transformers import Qwen2MoeForCausalLM  # noqa: E402

import relaymoe  # noqa: E402
import relaymoe.hf  # noqa: E402

VOCAB, PROMPT = 64, 8
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
config = tiny_qwen2_moe(vocab_size=VOCAB, max_position_embeddings=64)
torch.manual_seed(0)
reference = Qwen2MoeForCausalLM(config).eval()
model = copy.deepcopy(reference)
ctx = relaymoe.Context(comm)
blocks = relaymoe.hf.replace_moe_blocks(model, ctx)
explicit = relaymoe.hf.replace_moe_blocks(copy.deepcopy(reference), ctx, wait_timeout=7.5)
failures = []


def check(what, ok):
    if not ok:
        failures.append(what)
    print(f"rank {rank}: {what}: {'ok' if ok else 'FAILED'}")


def greedy(m, ids, **kw):
    with torch.no_grad():
        # synced_gpus given: generate's probe for FSDP fails to import with
        # Debian 12's PyTorch 1.13 on Python 3.11.
        return m.generate(ids, do_sample=False, pad_token_id=0, synced_gpus=False, **kw)


def run(m, ids, **kw):
    with torch.no_grad():
        return relaymoe.hf.generate(m, ctx, ids, do_sample=False, pad_token_id=0, **kw)


# 1. max_new_tokens differs: rank r stops after 4 + 5 r tokens.
ids = torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(10 + rank))
n = 4 + 5 * rank
want = greedy(reference, ids, max_new_tokens=n, eos_token_id=None)
got = run(model, ids, max_new_tokens=n, eos_token_id=None)
check(f"max_new_tokens={n}: {got.shape[1] - PROMPT} tokens, as the unswapped model's",
      got.shape == want.shape and torch.equal(got, want))
lengths = comm.allgather(got.shape[1])
check(f"the ranks stopped at different lengths {lengths}", size == 1 or len(set(lengths)) == size)

# 2. EOS on rank 0 first: its EOS is the third token its greedy output makes.
ids = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(20 + rank))
free = greedy(reference, ids, max_new_tokens=12, eos_token_id=None)[0, PROMPT:].tolist()
unused = [t for t in range(1, VOCAB) if t not in free]
eos = free[2] if rank == 0 else unused[0]
want = greedy(reference, ids, max_new_tokens=12, eos_token_id=eos)
got = run(model, ids, max_new_tokens=12, eos_token_id=eos)
check(f"eos {eos}: {got.shape[1] - PROMPT} tokens, as the unswapped model's",
      got.shape == want.shape and torch.equal(got, want))
lengths = comm.allgather(got.shape[1])
check(f"rank 0 ended first by EOS {lengths}", size == 1 or lengths[0] < min(lengths[1:]))

# 3. Batch 1 or 2, prompts of 8, 11, 14, ... tokens, 3 + 2 r new ones.
ids = torch.randint(0, VOCAB, (1 + rank % 2, PROMPT + 3 * rank), generator=torch.Generator().manual_seed(30 + rank))
want = greedy(reference, ids, max_new_tokens=3 + 2 * rank, eos_token_id=None)
got = run(model, ids, max_new_tokens=3 + 2 * rank, eos_token_id=None)
check(f"batch {ids.shape[0]}, prompt {ids.shape[1]}: {got.shape[1] - ids.shape[1]} tokens, as the unswapped "
      f"model's", got.shape == want.shape and torch.equal(got, want))
# The context's open layers: the blocks' one each, after every call above.
check("one layer per block", None not in {b.layer for b in blocks} and set(ctx._layers) == {b.layer for b in blocks})

# The blocks' waits: WAIT_TIMEOUT by default (RMOE_WAIT_TIMEOUT unset here), or as given.
waits = sorted({b.layer.config["wait_timeout"] for b in blocks})
default = relaymoe.hf.WAIT_TIMEOUT if "RMOE_WAIT_TIMEOUT" not in os.environ else waits[0]
check(f"blocks' layers wait {waits} s by default", waits == [default] and default > 0)
try:
    run(model, ids, max_new_tokens=2, synced_gpus=False)
    check("synced_gpus=False refused", size == 1)
except ValueError as e:
    check(f"synced_gpus=False refused ({e})", size > 1 and "synced_gpus" in str(e))
check("wait_timeout=7.5 kept", explicit[0]._options["wait_timeout"] == 7.5)

ctx.close()
failed = comm.allreduce(len(failures))
if rank == 0:
    print(f"hf_generate on {size} rank(s): {'PASS' if failed == 0 else f'FAIL ({failed} checks)'}")
sys.exit(0 if failed == 0 else 1)
