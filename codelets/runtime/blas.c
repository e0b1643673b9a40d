/* The BLAS the CPU kernels call: its threads per call, and which of
 * OpenBLAS's kernel sets runs, with advice when the CPU could run a wider
 * one. */
#include <stddef.h>
#include <strings.h>

#include <cblas.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_codelets.h"
#include "rmoe_config.h"

#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
/* Weak: the library then loads against any CBLAS (a reference BLAS where
 * OpenBLAS is not installed, as on the GPU machines bench/gpu/ packs for). */
#pragma weak openblas_set_num_threads
#pragma weak openblas_get_corename
#endif

int rmoe_codelets_blas_threads(int n)
{
#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
	if (openblas_set_num_threads && n >= 1) {
		openblas_set_num_threads(n);
		return n;
	}
#else
	(void)n;
#endif
	return 0;
}

/* ---- OpenBLAS's kernel set ------------------------------------------------------ */

const char *rmoe_blas_core(void)
{
#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
	if (openblas_get_corename) {
		const char *name = openblas_get_corename();
		if (name && *name)
			return name;
	}
#endif
	return "unknown";
}

/* The vector width OpenBLAS's x86-64 kernel sets use: 1 SSE, 2 AVX, 3
 * AVX2, 4 AVX-512; 0 for a name not known here (no advice then). */
static int core_level(const char *core)
{
	static const char *const levels[][8] = {
		{"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn"},
		{"Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat"},
		{"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"},
		{"Haswell", "Zen", "Excavator"},
		{"SkylakeX", "Cooperlake", "SapphireRapids"},
	};
	static const int level_of_row[] = {1, 1, 2, 3, 4};
	for (size_t r = 0; r < sizeof(levels) / sizeof(levels[0]); r++)
		for (size_t i = 0; i < 8 && levels[r][i]; i++)
			if (!strcasecmp(core, levels[r][i]))
				return level_of_row[r];
	return 0;
}

/* OpenBLAS's dynamic build picks its kernels by CPU model number, and a
 * model newer than the library (Debian 12's 0.3.21 on a 5th-generation
 * Xeon, model 207, under KVM) falls back to the SSE3 kernels of
 * "Prescott": sgemm at 58 GFLOP/s on two cores where the AVX-512 kernels
 * the CPU supports run at 245 (bench/results/rate.md). OPENBLAS_CORETYPE,
 * read when the library loads, overrides the choice. */
const char *rmoe_blas_core_advice(void)
{
#if defined(RMOE_HAVE_OPENBLAS_SET_NUM_THREADS) && defined(__x86_64__) && defined(__GNUC__)
	const int have = core_level(rmoe_blas_core());
	if (have == 0)
		return NULL;
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
		return have < 4 ? "SkylakeX" : NULL;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return have < 3 ? "Haswell" : NULL;
	if (__builtin_cpu_supports("avx"))
		return have < 2 ? "Sandybridge" : NULL;
#endif
	return NULL;
}
