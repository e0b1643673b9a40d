/* relaymoe: command-line front end. Owns MPI (initialised with
 * MPI_THREAD_MULTIPLE, as the library requires of an application that
 * initialises MPI itself) and hands over to a subcommand. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <relaymoe/relaymoe.h>

#include "app.h"
#include "messages.h"
#include "rmoe_config.h"

#ifdef RMOE_SIMGRID
/* StarPU's SimGrid mode owns main: it starts SMPI and MPI for StarPU-MPI,
 * then runs the application's main under the name starpu_main
 * (starpu_simgrid_wrap.h); StarPU-MPI's shutdown finalizes MPI. */
#define main starpu_main
int starpu_main(int argc, char **argv);
#define RMOE_MAIN_OWNS_MPI 1
#else
#define RMOE_MAIN_OWNS_MPI 0
#endif

static const char *usage =
	"usage: mpirun -np N relaymoe COMMAND [options]\n"
	"\n"
	"commands:\n"
	"  run      one MoE layer forward and backward, ring and all-to-all side by side\n"
	"  train    train a small MoE language model on the layers (AdamW, checkpoints)\n"
	"  plan     ring order, routing mode and per-hop estimates for a model on a cluster\n"
	"\n"
	"relaymoe COMMAND --help describes a command's options.\n"
	"relaymoe --blas-core prints the OpenBLAS kernel set the commands run with.\n";

/* OpenBLAS picks its kernels once, when it loads, by CPU model: on a CPU
 * newer than the library it falls back to narrower ones (SSE3 on a Xeon
 * with AVX-512, 4x slower GEMMs; rmoe_blas_core_advice). Before MPI
 * starts, the command then runs itself again with OPENBLAS_CORETYPE set;
 * a user's own OPENBLAS_CORETYPE is kept as it is. */
static void blas_kernels(char **argv)
{
#if !RMOE_MAIN_OWNS_MPI
	const char *advice = rmoe_blas_core_advice();
	if (!advice || getenv("OPENBLAS_CORETYPE"))
		return;
	if (setenv("OPENBLAS_CORETYPE", advice, 1) == 0)
		execv("/proc/self/exe", argv);
	unsetenv("OPENBLAS_CORETYPE"); /* not re-run: the library warns */
#else
	(void)argv;
#endif
}

int main(int argc, char **argv)
{
	int provided = 0;
	blas_kernels(argv);
	if (argc == 2 && strcmp(argv[1], "--blas-core") == 0) {
		printf("%s\n", rmoe_blas_core());
		return 0;
	}
	if (!RMOE_MAIN_OWNS_MPI && MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
		fprintf(stderr, "relaymoe: MPI_Init_thread failed\n");
		return 1;
	}
	int code;
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		rmoe_app_say("%s", usage);
		code = argc < 2 ? 2 : 0;
	} else if (strcmp(argv[1], "run") == 0) {
		code = rmoe_cmd_run(argc, argv, 2);
	} else if (strcmp(argv[1], "train") == 0) {
		code = rmoe_cmd_train(argc, argv, 2);
	} else if (strcmp(argv[1], "plan") == 0) {
		code = rmoe_cmd_plan(argc, argv, 2);
	} else {
		rmoe_app_say("relaymoe: unknown command '%s'\n%s", argv[1], usage);
		code = 2;
	}
	if (!RMOE_MAIN_OWNS_MPI)
		MPI_Finalize();
	return code;
}
