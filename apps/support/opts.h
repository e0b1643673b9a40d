/* A small table-driven command-line parser shared by the subcommands:
 * --name VALUE or --name=VALUE, flags without a value, and errors that name
 * the option and what was expected (with the closest known option for a
 * typo). Pure: no I/O, no exit, so it can be unit-tested and fuzzed. */
#ifndef RMOE_OPTS_H
#define RMOE_OPTS_H

#include <stddef.h>
#include <stdint.h>

enum rmoe_opt_kind {
	RMOE_OPT_FLAG,    /* sets *(int *)dst = 1 */
	RMOE_OPT_INT,     /* *(int64_t *)dst, within [min, max] */
	RMOE_OPT_SIZE,    /* *(int64_t *)dst, bytes with optional K/M/G/T suffix (powers of 1024) */
	RMOE_OPT_DOUBLE,  /* *(double *)dst, within [min, max] */
	RMOE_OPT_STRING,  /* *(const char **)dst = the argument */
};

struct rmoe_opt {
	const char *name;          /* without the leading "--" */
	enum rmoe_opt_kind kind;
	void *dst;
	double min, max;           /* for INT, SIZE and DOUBLE */
	const char *metavar;       /* for --help */
	const char *help;
	int *given;                /* optional: set to 1 when the option appears */
};

/* Parses argv[first..argc). Returns 0, 1 when --help was given (nothing
 * else is checked then), or a negative RMOE_E* code with msg filled. */
int rmoe_opts_parse(const struct rmoe_opt *opts, size_t nopts, int argc, char **argv, int first,
                    char *msg, size_t msglen);

/* Writes the option list for --help into buf. */
void rmoe_opts_help(const struct rmoe_opt *opts, size_t nopts, char *buf, size_t buflen);

/* Parses a byte count with an optional K/M/G/T suffix; 0 or -1. */
int rmoe_parse_size(const char *s, int64_t *out);

#endif
