/* What the programs say, and how their ranks agree on an outcome: rank 0
 * prints the lines meant for the user once, every rank prints its own
 * errors, and a collective vote gives every rank the worst code. */
#ifndef RMOE_MESSAGES_H
#define RMOE_MESSAGES_H

/* Every rank learns the worst (lowest) code of all ranks. A lost peer
 * (RMOE_EPEER) ends this process instead: a collective would wait for it
 * forever. */
int rmoe_app_agree(int rc);

/* Rank 0 prints; the others stay quiet. */
void rmoe_app_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Every rank prints an error line prefixed with its rank. */
void rmoe_app_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
