/* Replays files through a fuzz target without libFuzzer: each argument is
 * an input file or a directory of them. The suite runs the committed seed
 * corpora and every input that once crashed (regressions/) this way, in
 * every build, sanitizers included. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "replay: cannot open %s\n", path);
		return -1;
	}
	size_t cap = 4096, len = 0;
	unsigned char *buf = malloc(cap);
	for (size_t got; buf && (got = fread(buf + len, 1, cap - len, f)) > 0;) {
		len += got;
		if (len == cap) {
			unsigned char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	fclose(f);
	if (!buf)
		return -1;
	/* An exact-size copy, so ASan sees a read past the input. */
	unsigned char *exact = malloc(len ? len : 1);
	if (!exact) {
		free(buf);
		return -1;
	}
	memcpy(exact, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay(const char *path, int *count)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		fprintf(stderr, "replay: %s does not exist\n", path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		(*count)++;
		return replay_file(path);
	}
	DIR *dir = opendir(path);
	if (!dir)
		return -1;
	char **names = NULL;
	size_t n = 0;
	struct dirent *ent;
	while ((ent = readdir(dir))) {
		if (ent->d_name[0] == '.')
			continue;
		char **nn = realloc(names, (n + 1) * sizeof(*names));
		if (!nn)
			break;
		names = nn;
		names[n++] = strdup(ent->d_name);
	}
	closedir(dir);
	qsort(names, n, sizeof(*names), cmp_names);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		char child[4096];
		snprintf(child, sizeof(child), "%s/%s", path, names[i]);
		if (names[i] && replay(child, count) != 0)
			rc = -1;
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	int count = 0, rc = 0;
	for (int i = 1; i < argc; i++)
		if (replay(argv[i], &count) != 0)
			rc = 1;
	printf("replayed %d input(s)%s\n", count, rc ? ", some unreadable" : "");
	return rc || count == 0;
}
