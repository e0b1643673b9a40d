/* Preloaded into relaymoe by bench/rate/run.sh for the configurations with
 * more than one OpenBLAS thread per call (one StarPU worker, OpenBLAS
 * threads on the other cores). The library sets OpenBLAS to one thread
 * when its codelets start (codelets/init.c: one worker per core, no BLAS
 * threads on the other workers' cores); this call is ignored here, so the
 * count OpenBLAS read from OPENBLAS_NUM_THREADS at load stands. */
void openblas_set_num_threads(int n);

void openblas_set_num_threads(int n)
{
	(void)n;
}
