/* Task names with a hop number, interned. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_tasks.h"

/* StarPU keeps the name pointer until the task is gone, so names with a hop
 * number are interned for the life of the process (ops x hops: bounded). */
struct interned {
	struct interned *next;
	char s[];
};
static struct interned *interned_names;
static pthread_mutex_t interned_lock = PTHREAD_MUTEX_INITIALIZER;

const char *rmoe_task_name(const char *op, int hop)
{
	char buf[64];
	if (hop >= 0)
		snprintf(buf, sizeof(buf), "%s h%d", op, hop);
	else
		snprintf(buf, sizeof(buf), "%s", op);
	pthread_mutex_lock(&interned_lock);
	struct interned *i;
	for (i = interned_names; i; i = i->next)
		if (strcmp(i->s, buf) == 0)
			break;
	if (!i) {
		i = malloc(sizeof(*i) + strlen(buf) + 1);
		if (i) {
			strcpy(i->s, buf);
			i->next = interned_names;
			interned_names = i;
		}
	}
	pthread_mutex_unlock(&interned_lock);
	return i ? i->s : op;
}
