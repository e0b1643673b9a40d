/* File-system helpers shared by the library (trace folders) and the
 * programs (checkpoint folders). */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "rmoe_scheduler.h"

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
