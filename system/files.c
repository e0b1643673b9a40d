/* Files: folders made for the library (trace folders) and the programs
 * (checkpoint folders), and a cluster description read from its file for
 * the planner's parser (scheduler/cluster.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rmoe_system.h"

int rmoe_mkdir_p(const char *dir)
{
	char path[4096];
	if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
		return ENAMETOOLONG;
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		/* EEXIST: every rank may race to create the same folder. */
		if (mkdir(path, 0777) != 0 && errno != EEXIST)
			return errno;
		*p = '/';
	}
	if (mkdir(path, 0777) != 0 && errno != EEXIST)
		return errno;
	struct stat st;
	if (stat(path, &st) != 0)
		return errno;
	return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

int rmoe_cluster_load(const char *path, struct rmoe_cluster *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_cluster_load: out is NULL");
	memset(out, 0, sizeof(*out));
	if (!path || !*path)
		return rmoe_error(RMOE_EINVAL, "cluster file: expected a path");
	FILE *f = fopen(path, "rb");
	if (!f)
		return rmoe_error(RMOE_EIO, "cluster file %s: cannot open (%s)", path, strerror(errno));
	size_t cap = 0, len = 0;
	char *buf = NULL;
	int rc = 0;
	for (;;) {
		if (len == cap) {
			size_t ncap = cap ? 2 * cap : 16384;
			if (ncap > (size_t)RMOE_CLUSTER_MAX_FILE_BYTES + 1)
				ncap = (size_t)RMOE_CLUSTER_MAX_FILE_BYTES + 1;
			if (ncap == cap) {
				rc = rmoe_error(RMOE_EIO, "cluster file %s: larger than %d bytes", path,
				                RMOE_CLUSTER_MAX_FILE_BYTES);
				break;
			}
			char *nb = realloc(buf, ncap);
			if (!nb) {
				rc = rmoe_error(RMOE_ENOMEM, "cluster file %s: out of host memory", path);
				break;
			}
			buf = nb;
			cap = ncap;
		}
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0) {
			if (ferror(f))
				rc = rmoe_error(RMOE_EIO, "cluster file %s: read error", path);
			break;
		}
	}
	fclose(f);
	if (!rc && len > (size_t)RMOE_CLUSTER_MAX_FILE_BYTES)
		rc = rmoe_error(RMOE_EIO, "cluster file %s: larger than %d bytes", path, RMOE_CLUSTER_MAX_FILE_BYTES);
	if (!rc) {
		rc = rmoe_cluster_parse(buf, len, out);
		if (rc) {
			char msg[400];
			snprintf(msg, sizeof(msg), "%s", rmoe_last_error_message());
			rmoe_error(rc, "cluster file %s: %s", path, msg);
		}
	}
	free(buf);
	return rc;
}
