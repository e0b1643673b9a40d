/* All-to-all "sort by local expert" and its inverse: rows received from the
 * peers, chunk (q, e) each, reordered to (e, q) so that one grouped GEMM sees
 * every local expert's rows together, and back. */
#include <string.h>

#include "kernels.h"
#include "rmoe_codelets.h"

static void rmoe_sort_chunks_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_sort_args *a = cl_arg;
	const int64_t H = a->hidden, n_peers = a->n_peers, ne = a->n_experts;
	RMOE_CL_CHECK(H >= 1 && n_peers >= 1 && ne >= 1 &&
	                      (a->direction == RMOE_SORT_BY_EXPERT || a->direction == RMOE_UNSORT_TO_PEERS),
	              "sort-chunks: bad arguments H=%lld peers=%lld experts=%lld direction=%d",
	              (long long)H, (long long)n_peers, (long long)ne, a->direction);
	int64_t total = 0, n_active = 0;
	for (int64_t q = 0; q < n_peers; q++) {
		int64_t peer_rows = 0;
		for (int64_t e = 0; e < ne; e++) {
			RMOE_CL_CHECK(a->counts[q * ne + e] >= 0, "sort-chunks: counts[%lld] = %lld",
			              (long long)(q * ne + e), (long long)a->counts[q * ne + e]);
			peer_rows += a->counts[q * ne + e];
		}
		total += peer_rows;
		n_active += peer_rows > 0;
	}
	RMOE_CL_CHECK(rmoe_cl_nbuffers() == n_active + 1,
	              "sort-chunks: %d buffers, expected %lld (peers with rows, and the sorted one)",
	              rmoe_cl_nbuffers(), (long long)(n_active + 1));
	const int sort = a->direction == RMOE_SORT_BY_EXPERT;
	void *sorted_buffer = buffers[sort ? n_active : 0];
	void **peer_buffers = buffers + (sort ? 0 : 1);
	RMOE_CL_CHECK((int64_t)STARPU_VECTOR_GET_NX(sorted_buffer) == total * H,
	              "sort-chunks: sorted buffer has %lld elements, expected %lld",
	              (long long)STARPU_VECTOR_GET_NX(sorted_buffer), (long long)(total * H));
	float *sorted = (float *)STARPU_VECTOR_GET_PTR(sorted_buffer);

	/* Chunk (q, e) starts in the sorted buffer after every chunk of the experts
	 * before e, and after the chunks of e from the peers before q. */
	int64_t expert_start = 0;
	for (int64_t e = 0; e < ne; e++) {
		int64_t at = expert_start;
		int64_t active = 0;
		for (int64_t q = 0; q < n_peers; q++) {
			const int64_t *peer_counts = a->counts + q * ne;
			int64_t peer_rows = 0, before = 0;
			for (int64_t f = 0; f < ne; f++) {
				peer_rows += peer_counts[f];
				if (f < e)
					before += peer_counts[f];
			}
			if (peer_rows == 0)
				continue;
			void *peer = peer_buffers[active++];
			RMOE_CL_CHECK((int64_t)STARPU_VECTOR_GET_NX(peer) == peer_rows * H,
			              "sort-chunks: peer %lld buffer has %lld elements, expected %lld",
			              (long long)q, (long long)STARPU_VECTOR_GET_NX(peer),
			              (long long)(peer_rows * H));
			float *chunk = (float *)STARPU_VECTOR_GET_PTR(peer) + before * H;
			size_t bytes = (size_t)(peer_counts[e] * H) * sizeof(float);
			if (bytes) {
				if (sort)
					memcpy(sorted + at * H, chunk, bytes);
				else
					memcpy(chunk, sorted + at * H, bytes);
			}
			at += peer_counts[e];
		}
		expert_start = at;
	}
}

#ifdef STARPU_USE_CUDA
/* CUDA kernel of sort-chunks: not written yet; the codelet runs on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_sort_chunks = RMOE_PERFMODEL("rmoe_sort_chunks_v1", rmoe_sim_cost_sort_chunks);

/* One buffer per peer with rows, plus the sorted one: more than
 * STARPU_NMAXBUFS at 8 peers, so modes come with the insertion. */
struct starpu_codelet rmoe_cl_sort_chunks = {
	.name = "sort-chunks",
	.cpu_funcs = {rmoe_sort_chunks_cpu},
	.cpu_funcs_name = {"rmoe_sort_chunks_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = STARPU_VARIABLE_NBUFFERS,
	.model = &rmoe_model_sort_chunks,
};
