/* The all-to-all's "sort by local expert" codelet and its inverse: rows
 * received from the peers, chunk (q, e) each, reordered to (e, q) so that
 * one grouped GEMM sees every local expert's rows together, and back. */
#include "codelet.h"

/* One buffer per peer with rows, in peer order, and the sorted one (last
 * when sorting, first when unsorting). peer[q] receives the rows of peer q,
 * NULL for a peer with none. */
static int sort_chunks_unpack(void *buffers[], const struct rmoe_sort_args *a, float **peer, float **sorted)
{
	const int64_t H = a->hidden, n_peers = a->n_peers, ne = a->n_experts;
	if (!(H >= 1 && n_peers >= 1 && ne >= 1 &&
	      (a->direction == RMOE_SORT_BY_EXPERT || a->direction == RMOE_UNSORT_TO_PEERS)))
		return rmoe_cl_fail("sort-chunks", "bad arguments H=%lld peers=%lld experts=%lld direction=%d",
		                    (long long)H, (long long)n_peers, (long long)ne, a->direction);
	struct rmoe_cl_buffer *spec = calloc((size_t)n_peers + 1, sizeof(*spec));
	void **p = calloc((size_t)n_peers + 1, sizeof(*p));
	int64_t *peer_rows = calloc((size_t)n_peers, sizeof(*peer_rows));
	if (!spec || !p || !peer_rows) {
		free(spec);
		free(p);
		free(peer_rows);
		return rmoe_cl_fail("sort-chunks", "no memory for %lld peers", (long long)n_peers);
	}
	const int sort = a->direction == RMOE_SORT_BY_EXPERT;
	int64_t total = 0, n_active = 0;
	int rc = 0;
	for (int64_t q = 0; q < n_peers && !rc; q++)
		for (int64_t e = 0; e < ne && !rc; e++) {
			int64_t c = a->counts[q * ne + e];
			if (c < 0)
				rc = rmoe_cl_fail("sort-chunks", "counts[%lld] = %lld", (long long)(q * ne + e), (long long)c);
			peer_rows[q] += c;
			total += c;
		}
	for (int64_t q = 0; q < n_peers && !rc; q++)
		if (peer_rows[q] > 0)
			spec[(sort ? 0 : 1) + n_active++] = (struct rmoe_cl_buffer)RMOE_CL_BUF("peer rows", peer_rows[q] * H);
	spec[sort ? n_active : 0] = (struct rmoe_cl_buffer)RMOE_CL_BUF("sorted", total * H);
	if (!rc)
		rc = rmoe_cl_unpack("sort-chunks", buffers, spec, (int)n_active + 1, p);
	for (int64_t q = 0, i = 0; q < n_peers && !rc; q++)
		peer[q] = peer_rows[q] > 0 ? p[(sort ? 0 : 1) + i++] : NULL;
	*sorted = rc ? NULL : p[sort ? n_active : 0];
	free(spec);
	free(p);
	free(peer_rows);
	return rc;
}

/* The same body on the CPU and (device set) on a CUDA worker. */
static void sort_chunks_body(void *buffers[], const struct rmoe_sort_args *a, int device)
{
	float **peer = calloc(a->n_peers > 0 ? (size_t)a->n_peers : 1, sizeof(*peer));
	float *sorted = NULL;
	if (!peer) {
		rmoe_cl_fail("sort-chunks", "no memory for %lld peers", (long long)a->n_peers);
		return;
	}
	const int sort = a->direction == RMOE_SORT_BY_EXPERT;
	if (!sort_chunks_unpack(buffers, a, peer, &sorted)) {
#ifdef RMOE_HAVE_CUDA
		if (device)
			rmoe_cl_cuda_done("sort-chunks", rmoe_cuda_sort_chunks(RMOE_STREAM, rmoe_cl_elsize(buffers[0]), a->hidden,
			                                                       a->n_peers, a->n_experts, a->counts, sort,
			                                                       (void *const *)peer, sorted));
		else
#endif
			rmoe_kernel_sort_chunks(a->hidden, a->n_peers, a->n_experts, a->counts, sort, peer, sorted);
	}
	(void)device;
	free(peer);
}

static void rmoe_sort_chunks_cpu(void *buffers[], void *cl_arg)
{
	sort_chunks_body(buffers, cl_arg, 0);
}

#ifdef RMOE_HAVE_CUDA
static void sort_chunks_cuda(void *buffers[], void *cl_arg)
{
	sort_chunks_body(buffers, cl_arg, 1);
}
#endif

/* One buffer per peer with rows, plus the sorted one: more than
 * STARPU_NMAXBUFS at 8 peers. */
RMOE_CODELET(rmoe_cl_sort_chunks, "sort-chunks", rmoe_sort_chunks_cpu, sort_chunks_cuda, "rmoe_sort_chunks_v1",
             sort_chunks, STARPU_VARIABLE_NBUFFERS);

int rmoe_insert_sort_chunks(const struct rmoe_task_opts *o, enum rmoe_sort_direction direction, int64_t hidden,
                            int64_t n_peers, int64_t n_experts, const int64_t *counts,
                            const starpu_data_handle_t *per_peer, starpu_data_handle_t sorted)
{
	struct rmoe_sort_args *a = malloc(rmoe_sort_args_size(n_peers, n_experts));
	struct starpu_data_descr *d = calloc((size_t)n_peers + 1, sizeof(*d));
	if (!d) {
		free(a);
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	}
	if (a) {
		*a = (struct rmoe_sort_args){hidden, n_peers, n_experts, direction};
		memcpy(a->counts, counts, (size_t)(n_peers * n_experts) * sizeof(int64_t));
	}
	int nb = 0;
	const int sort = direction == RMOE_SORT_BY_EXPERT;
	if (!sort)
		d[nb++] = (struct starpu_data_descr){sorted, STARPU_R};
	for (int64_t q = 0; q < n_peers; q++)
		if (per_peer[q])
			d[nb++] = (struct starpu_data_descr){per_peer[q], sort ? STARPU_R : STARPU_W};
	if (sort)
		d[nb++] = (struct starpu_data_descr){sorted, STARPU_W};
	int rc = rmoe_cl_insert(o, &rmoe_cl_sort_chunks, d, nb, a, rmoe_sort_args_size(n_peers, n_experts), 0);
	free(d);
	return rc;
}
