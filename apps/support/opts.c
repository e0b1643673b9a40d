#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opts.h"
#include "relaymoe/relaymoe.h"

int rmoe_parse_size(const char *s, int64_t *out)
{
	if (!s || !*s)
		return -1;
	errno = 0;
	char *end;
	double v = strtod(s, &end);
	if (errno || end == s || !isfinite(v) || v < 0)
		return -1;
	double mult = 1;
	switch (*end) {
	case 'k': case 'K': mult = 1024.0; end++; break;
	case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'B') {
		if (*end == 'i')
			end++;
		if (*end == 'B')
			end++;
	}
	if (*end)
		return -1;
	v *= mult;
	if (v > 9.0e18)
		return -1;
	*out = (int64_t)v;
	return 0;
}

/* Edit distance, for "did you mean". */
static size_t distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 40 || lb > 40)
		return 99;
	size_t d[41][41];
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			size_t c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			if (d[i - 1][j] + 1 < c)
				c = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < c)
				c = d[i][j - 1] + 1;
			d[i][j] = c;
		}
	return d[la][lb];
}

static int parse_value(const struct rmoe_opt *o, const char *v, char *msg, size_t msglen)
{
	errno = 0;
	char *end = NULL;
	switch (o->kind) {
	case RMOE_OPT_INT: {
		long long x = strtoll(v, &end, 10);
		if (errno || end == v || *end || (double)x < o->min || (double)x > o->max) {
			snprintf(msg, msglen, "--%s '%s': expected an integer from %.0f to %.0f", o->name, v,
			         o->min, o->max);
			return RMOE_EINVAL;
		}
		*(int64_t *)o->dst = x;
		return 0;
	}
	case RMOE_OPT_SIZE: {
		int64_t x;
		if (rmoe_parse_size(v, &x) || (double)x < o->min || (double)x > o->max) {
			snprintf(msg, msglen, "--%s '%s': expected a byte count (e.g. 512M, 2G) from %.0f to %.0f",
			         o->name, v, o->min, o->max);
			return RMOE_EINVAL;
		}
		*(int64_t *)o->dst = x;
		return 0;
	}
	case RMOE_OPT_DOUBLE: {
		double x = strtod(v, &end);
		if (errno || end == v || *end || !isfinite(x) || x < o->min || x > o->max) {
			snprintf(msg, msglen, "--%s '%s': expected a number from %g to %g", o->name, v, o->min,
			         o->max);
			return RMOE_EINVAL;
		}
		*(double *)o->dst = x;
		return 0;
	}
	case RMOE_OPT_STRING:
		if (!*v) {
			snprintf(msg, msglen, "--%s: expected a non-empty value", o->name);
			return RMOE_EINVAL;
		}
		*(const char **)o->dst = v;
		return 0;
	case RMOE_OPT_FLAG:
		break;
	}
	return 0;
}

/* The option named name[0..nlen) in the first nsets sets, or NULL. */
static const struct rmoe_opt *find(const struct rmoe_opt_set *sets, size_t nsets, const char *name, size_t nlen)
{
	for (size_t s = 0; s < nsets; s++)
		for (size_t k = 0; k < sets[s].nopts; k++)
			if (strlen(sets[s].opts[k].name) == nlen && strncmp(sets[s].opts[k].name, name, nlen) == 0)
				return &sets[s].opts[k];
	return NULL;
}

/* The closest known name to given, within two edits, or NULL. */
static const char *closest(const struct rmoe_opt_set *sets, size_t nsets, const char *given)
{
	size_t best = 99;
	const char *name = NULL;
	for (size_t s = 0; s < nsets; s++)
		for (size_t k = 0; k < sets[s].nopts; k++) {
			size_t d = distance(given, sets[s].opts[k].name);
			if (d < best) {
				best = d;
				name = sets[s].opts[k].name;
			}
		}
	return best <= 2 ? name : NULL;
}

/* Sets shared by several commands meet in one command's list: a name
 * given twice would leave one of its options unreachable. */
static int check_unique(const struct rmoe_opt_set *sets, size_t nsets, char *msg, size_t msglen)
{
	for (size_t s = 0; s < nsets; s++)
		for (size_t k = 0; k < sets[s].nopts; k++) {
			const char *name = sets[s].opts[k].name;
			/* the sets before this one, then this one's options before k */
			struct rmoe_opt_set before = {NULL, sets[s].opts, k, NULL};
			if (find(sets, s, name, strlen(name)) || find(&before, 1, name, strlen(name))) {
				snprintf(msg, msglen, "option table: --%s is defined twice", name);
				return RMOE_EINVAL;
			}
		}
	return 0;
}

int rmoe_opts_parse_sets(const struct rmoe_opt_set *sets, size_t nsets, int argc, char **argv, int first,
                         char *msg, size_t msglen)
{
	int rc = check_unique(sets, nsets, msg, msglen);
	if (rc)
		return rc;
	for (int i = first; i < argc; i++)
		if (argv[i] && (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0))
			return 1;
	for (int i = first; i < argc; i++) {
		const char *arg = argv[i];
		if (!arg || strncmp(arg, "--", 2) != 0 || !arg[2]) {
			snprintf(msg, msglen, "unexpected argument '%s': options start with --", arg ? arg : "");
			return RMOE_EINVAL;
		}
		const char *name = arg + 2;
		const char *eq = strchr(name, '=');
		size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
		const struct rmoe_opt *o = find(sets, nsets, name, nlen);
		if (!o) {
			char given[48];
			snprintf(given, sizeof(given), "%.*s", (int)(nlen < 40 ? nlen : 40), name);
			const char *near = closest(sets, nsets, given);
			if (near)
				snprintf(msg, msglen, "unknown option '--%s' (did you mean --%s?); see --help", given, near);
			else
				snprintf(msg, msglen, "unknown option '--%s'; see --help", given);
			return RMOE_EINVAL;
		}
		if (o->given)
			*o->given = 1;
		if (o->kind == RMOE_OPT_FLAG) {
			if (eq) {
				snprintf(msg, msglen, "--%s takes no value (got '%s')", o->name, eq + 1);
				return RMOE_EINVAL;
			}
			*(int *)o->dst = 1;
			continue;
		}
		const char *v;
		if (eq)
			v = eq + 1;
		else if (i + 1 < argc && argv[i + 1])
			v = argv[++i];
		else {
			snprintf(msg, msglen, "--%s needs a value (%s)", o->name, o->metavar ? o->metavar : "VALUE");
			return RMOE_EINVAL;
		}
		rc = parse_value(o, v, msg, msglen);
		if (rc)
			return rc;
	}
	return 0;
}

int rmoe_opts_parse(const struct rmoe_opt *opts, size_t nopts, int argc, char **argv, int first,
                    char *msg, size_t msglen)
{
	const struct rmoe_opt_set set = {NULL, opts, nopts, NULL};
	return rmoe_opts_parse_sets(&set, 1, argc, argv, first, msg, msglen);
}

/* The value *o->dst holds before parsing, as --help shows it; "" when it
 * is zero or unset (flags have none). */
static void default_text(const struct rmoe_opt *o, char *buf, size_t len)
{
	buf[0] = '\0';
	switch (o->kind) {
	case RMOE_OPT_INT:
	case RMOE_OPT_SIZE:
		if (*(const int64_t *)o->dst)
			snprintf(buf, len, " (default %lld)", (long long)*(const int64_t *)o->dst);
		break;
	case RMOE_OPT_DOUBLE:
		if (*(const double *)o->dst != 0.0)
			snprintf(buf, len, " (default %g)", *(const double *)o->dst);
		break;
	case RMOE_OPT_STRING:
		if (*(const char *const *)o->dst)
			snprintf(buf, len, " (default %.64s)", *(const char *const *)o->dst);
		break;
	case RMOE_OPT_FLAG:
		break;
	}
}

/* Appends to buf[used..buflen) what fmt makes; the new used, at most
 * buflen (output cut short there). */
static size_t append(char *buf, size_t buflen, size_t used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t append(char *buf, size_t buflen, size_t used, const char *fmt, ...)
{
	if (used >= buflen)
		return buflen;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf + used, buflen - used, fmt, ap);
	va_end(ap);
	if (n < 0)
		return buflen;
	return used + (size_t)n < buflen ? used + (size_t)n : buflen;
}

void rmoe_opts_help_sets(const struct rmoe_opt_set *sets, size_t nsets, char *buf, size_t buflen)
{
	size_t used = 0;
	if (buflen)
		buf[0] = '\0';
	for (size_t s = 0; s < nsets; s++) {
		if (sets[s].title)
			used = append(buf, buflen, used, "%s%s:\n", s ? "\n" : "", sets[s].title);
		for (size_t k = 0; k < sets[s].nopts; k++) {
			const struct rmoe_opt *o = &sets[s].opts[k];
			char left[64], def[96];
			if (o->kind == RMOE_OPT_FLAG)
				snprintf(left, sizeof(left), "--%s", o->name);
			else
				snprintf(left, sizeof(left), "--%s %s", o->name, o->metavar ? o->metavar : "V");
			default_text(o, def, sizeof(def));
			used = append(buf, buflen, used, "  %-24s %s%s\n", left, o->help, def);
		}
		if (sets[s].note)
			used = append(buf, buflen, used, "%s", sets[s].note);
	}
}

void rmoe_opts_help(const struct rmoe_opt *opts, size_t nopts, char *buf, size_t buflen)
{
	const struct rmoe_opt_set set = {NULL, opts, nopts, NULL};
	rmoe_opts_help_sets(&set, 1, buf, buflen);
}
