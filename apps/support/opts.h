/* A small table-driven command-line parser shared by the subcommands:
 * --name VALUE or --name=VALUE, flags without a value, and errors that name
 * the option and what was expected (with the closest known option for a
 * typo). A command's options come as sets (the layer's shape, the context,
 * its own), each one table; --help lists them set by set, each option with
 * the default its destination holds. Pure: no I/O, no exit, so it can be
 * unit-tested and fuzzed. */
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

/* One table of options under a title for --help (NULL: none), with an
 * optional paragraph printed after its options. */
struct rmoe_opt_set {
	const char *title;
	const struct rmoe_opt *opts;
	size_t nopts;
	const char *note;
};

/* The number of elements of an array, refused at compile time for a
 * pointer (whose sizeof would count something else). */
#define RMOE_NELEMS(a)                                                                                       \
	(sizeof(a) / sizeof((a)[0]) +                                                                            \
	 0 * sizeof(char[1 - 2 * __builtin_types_compatible_p(__typeof__(a), __typeof__(&(a)[0]))]))

/* A set of the array table, sized by the compiler. */
#define RMOE_OPT_SET(title, table, note) {(title), (table), RMOE_NELEMS(table), (note)}

/* Parses argv[first..argc) against the options of every set. Returns 0, 1
 * when --help was given (nothing else is checked then), or a negative
 * RMOE_E* code with msg filled; RMOE_EINVAL too when two options of the
 * sets share a name. */
int rmoe_opts_parse_sets(const struct rmoe_opt_set *sets, size_t nsets, int argc, char **argv, int first,
                         char *msg, size_t msglen);

/* The same over one table. */
int rmoe_opts_parse(const struct rmoe_opt *opts, size_t nopts, int argc, char **argv, int first,
                    char *msg, size_t msglen);

/* Writes the option list for --help into buf: each set's title, its options
 * (a value option whose destination holds a non-zero value shows it as its
 * default) and its note. Cut short, never overrun, when buf is too small. */
void rmoe_opts_help_sets(const struct rmoe_opt_set *sets, size_t nsets, char *buf, size_t buflen);

/* The same for one table without a title. */
void rmoe_opts_help(const struct rmoe_opt *opts, size_t nopts, char *buf, size_t buflen);

/* Parses a byte count with an optional K/M/G/T suffix; 0 or -1. */
int rmoe_parse_size(const char *s, int64_t *out);

#endif
